package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Host-wide claims on raw block volumes. Each sandbox has its own shim
// process, so "one medium under one guest page cache" is kept across
// processes by files in a directory all shims of a state_dir share
// (Options.BlockClaimDir, default <state_dir>/block-claims):
//
//   - <major>_<minor>.lock: the guard, flock'ed (exclusive) only while a
//     claim is checked, taken or given back;
//   - <major>_<minor>.<pid>.<sandbox>: one holder, flock'ed (exclusive) by
//     its shim for as long as the claim lasts; it holds the holder's
//     description (JSON).
//
// A device held read-write by one holder cannot be claimed by another, nor
// claimed read-write while anyone holds it. A holder file nobody has locked
// is stale (its shim died: the kernel dropped its lock) and is removed. The
// descriptors are close-on-exec: the VMM does not inherit a claim.

// claimHolder describes a claim's holder (the holder file's content).
type claimHolder struct {
	Sandbox   string `json:"sandbox"`
	Container string `json:"container"`
	Device    string `json:"device"`
	ReadOnly  bool   `json:"read_only"`
	Pid       int    `json:"pid"`
}

func (h claimHolder) String() string {
	mode := "read-write"
	if h.ReadOnly {
		mode = "read-only"
	}
	return fmt.Sprintf("sandbox %s (container %s, shim pid %d, %s)", h.Sandbox, h.Container, h.Pid, mode)
}

// blockClaim is this process's hold on a host block device.
type blockClaim struct {
	dir, guard, path string
	f                *os.File
}

// lockFile opens path (creating it) and flocks it; how is LOCK_EX or
// LOCK_EX|LOCK_NB.
func lockFile(path string, flags, how int) (*os.File, error) {
	f, err := os.OpenFile(path, flags|os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// claimBlockDevice claims the host block device major:minor for h; a
// conflicting live holder is refused with FailedPrecondition naming the
// device and the holder.
func claimBlockDevice(dir string, major, minor uint32, h claimHolder) (*blockClaim, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("block volume claims: %w", err)
	}
	key := fmt.Sprintf("%d_%d", major, minor)
	guardPath := filepath.Join(dir, key+".lock")
	guard, err := lockFile(guardPath, 0, unix.LOCK_EX)
	if err != nil {
		return nil, fmt.Errorf("block volume claims: lock %s: %w", guardPath, err)
	}
	defer guard.Close() // unlocks
	holders, err := liveHolders(dir, key)
	if err != nil {
		return nil, err
	}
	for _, o := range holders {
		if !h.ReadOnly || !o.ReadOnly {
			return nil, fmt.Errorf("block device %s (%d:%d) is attached to %s: a raw block volume attached read-write to one sandbox cannot be attached to another, nor read-write while another holds it (two guest page caches over one device would corrupt it); delete that container first, or attach it read-only in both: %w",
				h.Device, major, minor, o, errdefs.ErrFailedPrecondition)
		}
	}
	path := filepath.Join(dir, fmt.Sprintf("%s.%d.%s", key, h.Pid, h.Sandbox))
	f, err := lockFile(path, os.O_EXCL, unix.LOCK_EX|unix.LOCK_NB)
	if err != nil {
		return nil, fmt.Errorf("block volume claim %s: %w", path, err)
	}
	b, _ := json.Marshal(h)
	if _, err := f.Write(b); err != nil {
		os.Remove(path)
		f.Close()
		return nil, fmt.Errorf("block volume claim %s: %w", path, err)
	}
	return &blockClaim{dir: dir, guard: guardPath, path: path, f: f}, nil
}

// liveHolders lists the holders of key whose shim still holds the lock and
// removes the stale ones. The caller holds the guard.
func liveHolders(dir, key string) ([]claimHolder, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("block volume claims: %w", err)
	}
	var out []claimHolder
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), key+".") || e.Name() == key+".lock" {
			continue
		}
		p := filepath.Join(dir, e.Name())
		f, err := lockFile(p, 0, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			// Nobody holds it: its shim is gone.
			os.Remove(p)
			f.Close()
			continue
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("block volume claim %s: %w", p, err)
		}
		var h claimHolder
		b, rerr := os.ReadFile(p)
		if rerr != nil || json.Unmarshal(b, &h) != nil {
			h = claimHolder{Sandbox: "(unreadable claim " + p + ")"}
		}
		out = append(out, h)
	}
	return out, nil
}

// release gives the claim back. Idempotent.
func (c *blockClaim) release() error {
	if c == nil || c.f == nil {
		return nil
	}
	guard, err := lockFile(c.guard, 0, unix.LOCK_EX)
	if err != nil {
		// Without the guard the holder file stays; closing still drops the
		// lock, so the next claimer finds it stale.
		c.f.Close()
		c.f = nil
		return fmt.Errorf("block volume claims: lock %s: %w", c.guard, err)
	}
	defer guard.Close()
	err = os.Remove(c.path)
	c.f.Close()
	c.f = nil
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("block volume claim %s: %w", c.path, err)
	}
	return nil
}
