package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// A reference says that a process maps a snapshot's files (a VM restored
// from it, or rolled back to it): while it is held, Delete refuses the
// snapshot. References are files, refs/<id>/<hash of holder>.json, so they
// outlive the process that took them: each records the holder's name and the
// process whose life it follows (pid, start time, boot id). Once that process
// is gone (exited, pid reused, or the machine rebooted) the reference is
// stale, and Collect, or a Delete of that snapshot, drops it. Liveness is a
// pid rather than a callback because any process on the root (the shim, the
// CLI, the HTTP facade) must be able to tell, without the one that took it.

// Holder names who takes a reference.
type Holder struct {
	// Name is shown in refusals ("sandbox sb1", "fork f1 clone 2"); one
	// holder has at most one reference per snapshot. 1 to 256 bytes of
	// UTF-8 without control characters.
	Name string
	// PID is the process whose life the reference follows: the VMM that
	// maps the files. 0 means the calling process.
	PID int
}

// Reference is one holder's reference to a snapshot.
type Reference struct {
	Holder   string
	Process  Process
	Acquired time.Time
	// Stale: the process is gone; the reference no longer counts and is
	// dropped at the next Collect or Delete.
	Stale bool
	// Err: the reference file does not validate. It counts as held (a VM
	// may map the snapshot); Holder names the file to look at.
	Err error
}

func (r Reference) String() string {
	if r.Err != nil {
		return r.Holder
	}
	return fmt.Sprintf("%q (%s, since %s)", r.Holder, r.Process, r.Acquired.Format(time.RFC3339))
}

// refName is the file name of holder's reference.
func refName(holder string) string {
	h := sha256.Sum256([]byte(holder))
	return hex.EncodeToString(h[:16]) + ".json"
}

// Acquire records that holder maps snapshot ref (id or name). Acquiring
// again by the same holder replaces its reference (one Release drops it).
func (s *Store) Acquire(ctx context.Context, ref string, h Holder) error {
	if err := checkText("holder", h.Name); err != nil {
		return fmt.Errorf("store: acquire %q: %w", ref, invalid(err))
	}
	pid := h.PID
	if pid == 0 {
		pid = os.Getpid()
	}
	proc, err := processOf(pid, s.boot)
	if err != nil {
		return fmt.Errorf("store: acquire %q for holder %q: %w (give the pid of the running VMM): %w", ref, h.Name, err, errdefs.ErrInvalidArgument)
	}
	unlock, err := s.lock(ctx, unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	id, _, err := s.resolve(ref)
	if err != nil {
		return fmt.Errorf("store: acquire: %w", err)
	}
	r := refFile{Version: FormatVersion, Snapshot: id, Holder: h.Name, Process: proc, Acquired: time.Now().UTC()}
	b, err := encode(&r)
	if err == nil {
		err = os.MkdirAll(s.refsPath(id), 0o700)
	}
	if err == nil {
		err = writeAtomic(s.refsPath(id), refName(h.Name), b)
	}
	if err != nil {
		return fmt.Errorf("store: acquire %s for holder %q: %w", id, h.Name, err)
	}
	s.log.WithFields(map[string]any{"id": id, "holder": h.Name, "pid": pid}).Debug("reference acquired")
	return nil
}

// Release drops holder's reference to snapshot ref (id or name).
func (s *Store) Release(ctx context.Context, ref, holder string) error {
	if err := checkText("holder", holder); err != nil {
		return fmt.Errorf("store: release %q: %w", ref, invalid(err))
	}
	unlock, err := s.lock(ctx, unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	id, _, err := s.resolve(ref)
	if err != nil && id == "" {
		return fmt.Errorf("store: release: %w", err)
	}
	err = os.Remove(filepath.Join(s.refsPath(id), refName(holder)))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("store: release %s: holder %q holds no reference to it: %w", id, holder, errdefs.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("store: release %s for holder %q: %w", id, holder, err)
	}
	os.Remove(s.refsPath(id)) // only if empty
	s.log.WithFields(map[string]any{"id": id, "holder": holder}).Debug("reference released")
	return nil
}

// readRefs lists snapshot id's references, oldest first.
func (s *Store) readRefs(id string) []Reference {
	dir := s.refsPath(id)
	files, err := readDirNames(dir)
	if err != nil {
		return []Reference{{Holder: "unreadable " + dir, Err: err}}
	}
	var out []Reference
	for _, f := range files {
		if strings.HasPrefix(f, ".") {
			continue // a temporary file of writeAtomic
		}
		p := filepath.Join(dir, f)
		r, err := s.readRef(p, id, f)
		if err != nil {
			out = append(out, Reference{Holder: "unreadable reference file " + p + " (remove it once no VM maps the snapshot)", Err: err})
			continue
		}
		out = append(out, Reference{Holder: r.Holder, Process: r.Process, Acquired: r.Acquired, Stale: !r.Process.alive(s.boot)})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Acquired.Before(out[j].Acquired) })
	return out
}

func (s *Store) readRef(p, id, file string) (*refFile, error) {
	b, err := readFile(p, maxRefFile)
	if err != nil {
		return nil, err
	}
	r, err := parseRef(b)
	if err != nil {
		return nil, err
	}
	if r.Snapshot != id || refName(r.Holder) != file {
		return nil, corrupt(fmt.Errorf("reference of %q to %s in the file of another", r.Holder, r.Snapshot))
	}
	return r, nil
}

// dropStaleLocked removes id's stale references and returns the live ones
// and those it removed.
func (s *Store) dropStaleLocked(id string) (live, dropped []Reference) {
	for _, r := range s.readRefs(id) {
		if !r.Stale {
			live = append(live, r)
			continue
		}
		if err := os.Remove(filepath.Join(s.refsPath(id), refName(r.Holder))); err != nil && !errors.Is(err, fs.ErrNotExist) {
			live = append(live, r) // it stays; so does its snapshot
			continue
		}
		dropped = append(dropped, r)
	}
	os.Remove(s.refsPath(id)) // only if empty
	return live, dropped
}
