package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// Host directories (hostPath and PVC volumes, ctr --mount type=bind) reach
// the guest through one virtio-fs share per sandbox VM (docs/shim.md,
// "Volumes"). cube-vmm's devices are fixed at boot, so every VM boots with
// the share: ShareDirName in the sandbox's state dir, empty until a
// container needs a host directory. ShareHostDir then bind-mounts
// (MS_BIND|MS_REC; read-only on the host too when asked) the source at
// a new entry of that directory; cube-vmm's FUSE server crosses mount points
// below the share (its openat2 uses RESOLVE_BENEATH, not RESOLVE_NO_XDEV), so
// a bind made after boot is seen. The agent mounts the share once at
// GuestShareRoot, and the container binds its entry.

// ShareTag is the virtio-fs tag of the sandbox's share.
const ShareTag = "cube-vol"

// ShareDirName is the share's directory in the sandbox's state dir.
const ShareDirName = "fs"

// GuestShareRoot is where the agent mounts the share in the guest.
const GuestShareRoot = "/run/cube/shared"

func (s *Sandbox) shareDir() string { return shareDirIn(s.o.Dir) }

// shareDirIn is the share's directory in the sandbox state dir dir.
func shareDirIn(dir string) string { return filepath.Join(dir, ShareDirName) }

// prepareShare makes the share's directory before the VMM starts and says
// whether the VM gets (or, restored, has) the share. A restored snapshot
// has it only if its VMM had one tagged ShareTag.
func (s *Sandbox) prepareShare() (bool, error) {
	if s.o.Template != "" {
		ok, err := snapshotHasShare(s.o.Template)
		if err != nil || !ok {
			return false, err
		}
	}
	if err := os.Mkdir(s.shareDir(), 0o700); err != nil && !os.IsExist(err) {
		return false, fmt.Errorf("sandbox %s: share dir: %w", s.o.ID, err)
	}
	return true, nil
}

// snapshotHasShare reads a snapshot's VMM configuration for the share.
func snapshotHasShare(dir string) (bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, snapshot.ManifestName))
	if os.IsNotExist(err) {
		return false, nil // not a snapshot: cube-vmm restore says so
	}
	if err != nil {
		return false, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	m, err := snapshot.ParseManifest(b)
	if err != nil {
		return false, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	var cfg struct{ FS []struct{ Tag string } }
	if len(m.Config) > 0 {
		if err := json.Unmarshal(m.Config, &cfg); err != nil {
			return false, fmt.Errorf("snapshot %s: VMM configuration: %v: %w", dir, err, errdefs.ErrFailedPrecondition)
		}
	}
	return slices.ContainsFunc(cfg.FS, func(f struct{ Tag string }) bool { return f.Tag == ShareTag }), nil
}

// ShareRequest is one host directory to share with the guest.
type ShareRequest struct {
	// Source is the host directory; ReadOnly binds it read-only on the
	// host too.
	Source   string
	ReadOnly bool
	// Ref names the use in errors ("hostPath volume \"data\" at /data").
	Ref string
	// Container and Destination are the container and its mount point: a
	// restore of a snapshot re-binds each share by its Destination in the
	// new container's spec (SharesName).
	Container, Destination string
}

// ShareHostDir shares r's host directory with the guest and returns its
// guest path. Release it with UnshareHostDir(guest path).
func (s *Sandbox) ShareHostDir(ctx context.Context, r ShareRequest) (string, error) {
	s.mu.Lock()
	has, agent := s.share, s.agent
	s.shareSeq++
	name := "v" + strconv.Itoa(s.shareSeq)
	s.mu.Unlock()
	if !has {
		return "", fmt.Errorf("%s: this sandbox's VM has no virtio-fs share (it was restored from a snapshot made without one); start it from a cold boot or a newer template: %w",
			r.Ref, errdefs.ErrFailedPrecondition)
	}
	if agent == nil {
		return "", fmt.Errorf("%s: sandbox %s has no agent: %w", r.Ref, s.o.ID, errdefs.ErrFailedPrecondition)
	}
	target := filepath.Join(s.shareDir(), name)
	if err := bindHostDir(r.Source, target, r.ReadOnly); err != nil {
		return "", fmt.Errorf("%s: share host directory %s with the VM: %w", r.Ref, r.Source, err)
	}
	// Idempotent: the agent mounts the share at its first use.
	if err := agent.PrepareVolume(ctx, VolumeRequest{Path: GuestShareRoot, Mode: 0o755, VirtiofsTag: ShareTag}); err != nil {
		_ = unbindHostDir(target)
		return "", fmt.Errorf("%s: mount the virtio-fs share in the VM: %w", r.Ref, err)
	}
	s.mu.Lock()
	s.shared = append(s.shared, SharedDir{Guest: path.Join(GuestShareRoot, name), Host: r.Source, Ref: r.Ref,
		Name: name, ReadOnly: r.ReadOnly, Container: r.Container, Destination: r.Destination})
	s.mu.Unlock()
	return path.Join(GuestShareRoot, name), nil
}

// SharedDir is a host directory in the sandbox's share: its entry Name
// ("v1") in the share, its guest path, the host directory, and the use.
type SharedDir struct {
	Guest, Host, Ref       string
	Name                   string
	ReadOnly               bool
	Container, Destination string
}

// SharedDirs lists the host directories shared now.
func (s *Sandbox) SharedDirs() []SharedDir {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.shared)
}

// UnshareHostDir removes a ShareHostDir bind from the share (lazily: the
// guest may still hold files of it open).
func (s *Sandbox) UnshareHostDir(guest string) error {
	s.mu.Lock()
	s.shared = slices.DeleteFunc(s.shared, func(d SharedDir) bool { return d.Guest == guest })
	s.mu.Unlock()
	name := path.Base(guest)
	if path.Dir(guest) != GuestShareRoot || name == "." || name == ".." {
		return fmt.Errorf("unshare %q: not a shared directory", guest)
	}
	return unbindHostDir(filepath.Join(s.shareDir(), name))
}

// bindHostDir bind-mounts src (recursively) at a new directory target,
// read-only (with every submount) when ro, and a slave of src's mounts:
// mounts appearing below src later show through, nothing propagates back.
func bindHostDir(src, target string, ro bool) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", src)
	}
	if err := os.Mkdir(target, 0o700); err != nil {
		return err
	}
	if err := unix.Mount(src, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		_ = os.Remove(target)
		return fmt.Errorf("bind mount: %w", err)
	}
	if err := unix.Mount("", target, "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		_ = unbindHostDir(target)
		return fmt.Errorf("make the bind mount a slave: %w", err)
	}
	if ro {
		// Ordering: read-only before the path is handed to the guest.
		attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
		err := unix.MountSetattr(-1, target, unix.AT_RECURSIVE, attr)
		if err == unix.ENOSYS {
			err = unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, "")
		}
		if err != nil {
			_ = unbindHostDir(target)
			return fmt.Errorf("make the bind mount read-only: %w", err)
		}
	}
	return nil
}

// unbindHostDir detaches the bind at target and removes the (then empty)
// directory. rmdir never removes host contents: a bind still there fails it.
func unbindHostDir(target string) error {
	if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmount %s: %w", target, err)
	}
	if err := os.Remove(target); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// ReleaseShareDir detaches every bind in dir's share directory and removes
// it. Ordering: before anything removes dir recursively — a bind still in
// place would let that removal reach into the host directory it shows. An
// error means something is left there; then dir must not be removed.
func ReleaseShareDir(dir string) error {
	sd := filepath.Join(dir, ShareDirName)
	ents, err := os.ReadDir(sd)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := unbindHostDir(filepath.Join(sd, e.Name())); err != nil {
			return err
		}
	}
	return os.Remove(sd)
}
