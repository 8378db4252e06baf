// Package snapshotter implements containerd's snapshots.Snapshotter with one
// ext4 image file per snapshot. A new first layer starts from an empty sparse
// ext4 image; every child is a reflink (or, where the filesystem cannot
// reflink, a sparse copy) of its committed parent. Metadata lives in
// containerd's bolt-backed storage.MetaStore.
//
// On-disk layout under Root:
//
//	metadata.db        containerd snapshot metadata
//	lock               flock held by the running process
//	snapshots/<id>.img image of snapshot <id> (active, committed or parentless view)
//	snapshots/rm-*     images being removed (deleted after the metadata commit)
//	tmp/               images under construction; emptied at start
//
// Crash safety: an image is built under tmp/, fsynced, and renamed into
// snapshots/ inside the metadata write transaction that creates its record.
// Anything in tmp/, and anything in snapshots/ without a record, is left over
// from an interrupted call and removed at start (and by Cleanup).
package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/snapshotter/imagefile"
)

// LabelSize overrides the image size of one snapshot ("10GiB", "512M" or bytes).
// For a new first-layer image it is the size mkfs gets; for a child it grows
// the reflinked image (shrinking is refused). Being under containerd's
// "containerd.io/snapshot/" prefix, containerd passes it through to us, e.g.
// `ctr run --snapshotter-label containerd.io/snapshot/cube.size=20GiB`.
const LabelSize = "containerd.io/snapshot/cube.size"

// ReflinkPolicy chooses between reflink and copy.
type ReflinkPolicy string

const (
	// ReflinkAuto reflinks when the root filesystem supports it, else copies (with a warning).
	ReflinkAuto ReflinkPolicy = "auto"
	// ReflinkRequired refuses to start where reflink is unavailable.
	ReflinkRequired ReflinkPolicy = "required"
	// ReflinkNever always copies (for tests and benchmarks).
	ReflinkNever ReflinkPolicy = "never"
)

// Options configure a Snapshotter.
type Options struct {
	// Root holds metadata and images. It must be on the filesystem that is to
	// reflink (XFS with reflink=1, btrfs).
	Root string
	// DefaultSize is the size of new first-layer images, in bytes.
	DefaultSize int64
	// Reflink chooses reflink vs copy; "" means ReflinkAuto.
	Reflink ReflinkPolicy
	// Ext4 passes mkfs.ext4 options through.
	Ext4 imagefile.Ext4Options
	// Log receives the snapshotter's log lines; nil means logrus's standard logger.
	Log *logrus.Entry
}

// Snapshotter is the ext4-image snapshotter. It is safe for concurrent use.
type Snapshotter struct {
	root, imgDir, tmpDir string
	opts                 Options
	mode                 imagefile.Mode
	ms                   *storage.MetaStore
	log                  *logrus.Entry
	lock                 *os.File // flock on root/lock: one process per root

	closeOnce sync.Once
	closeErr  error
}

var _ snapshots.Snapshotter = (*Snapshotter)(nil)
var _ snapshots.Cleaner = (*Snapshotter)(nil)

// New opens (or creates) a snapshotter at opts.Root, decides the clone mode and
// removes what interrupted calls left behind.
func New(ctx context.Context, opts Options) (*Snapshotter, error) {
	if opts.Root == "" {
		return nil, fmt.Errorf("snapshotter: root directory not set")
	}
	if opts.DefaultSize < imagefile.MinSize || opts.DefaultSize > imagefile.MaxSize {
		return nil, fmt.Errorf("snapshotter: default size %d out of range [%d, %d]", opts.DefaultSize, imagefile.MinSize, imagefile.MaxSize)
	}
	if opts.Reflink == "" {
		opts.Reflink = ReflinkAuto
	}
	log := opts.Log
	if log == nil {
		log = logrus.NewEntry(logrus.StandardLogger())
	}
	root, err := filepath.Abs(opts.Root)
	if err != nil {
		return nil, fmt.Errorf("snapshotter: root %q: %w", opts.Root, err)
	}
	s := &Snapshotter{
		root:   root,
		imgDir: filepath.Join(root, "snapshots"),
		tmpDir: filepath.Join(root, "tmp"),
		opts:   opts,
		log:    log.WithField("root", root),
	}
	for _, d := range []string{root, s.imgDir, s.tmpDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("snapshotter: %w", err)
		}
	}
	// Ordering: take the root lock before touching tmp/ or the metadata; a
	// second process would otherwise delete a live Prepare's image, and
	// bolt's own lock would block it forever instead of failing.
	if s.lock, err = lockRoot(root); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			s.lock.Close()
		}
	}()
	if s.mode, err = s.chooseMode(); err != nil {
		return nil, err
	}
	// Leftovers in tmp/ are from Prepare calls that never reached their metadata
	// commit; nothing references them. Remove before the metastore is opened so
	// no concurrent call can be building one.
	if n, err := removeAllIn(s.tmpDir); err != nil {
		return nil, fmt.Errorf("snapshotter: clear %s: %w", s.tmpDir, err)
	} else if n > 0 {
		s.log.WithField("count", n).Warn("removed half-created images from an interrupted run")
	}
	if s.ms, err = storage.NewMetaStore(filepath.Join(root, "metadata.db")); err != nil {
		return nil, fmt.Errorf("snapshotter: open metadata: %w", err)
	}
	if err := s.Cleanup(ctx); err != nil {
		s.ms.Close()
		return nil, fmt.Errorf("snapshotter: startup cleanup: %w", err)
	}
	s.log.WithFields(logrus.Fields{"mode": s.mode, "default_size": opts.DefaultSize}).Info("snapshotter ready")
	ok = true
	return s, nil
}

func (s *Snapshotter) chooseMode() (imagefile.Mode, error) {
	if s.opts.Reflink == ReflinkNever {
		s.log.Info("reflink disabled by configuration: children are full copies")
		return imagefile.ModeCopy, nil
	}
	ok, err := imagefile.ProbeReflink(s.tmpDir)
	if err != nil {
		return "", fmt.Errorf("snapshotter: %w", err)
	}
	switch {
	case ok:
		return imagefile.ModeReflink, nil
	case s.opts.Reflink == ReflinkRequired:
		return "", fmt.Errorf("snapshotter: %s cannot reflink (FICLONE unsupported) and reflink = %q; put root on XFS (reflink=1) or btrfs, e.g. with contrib/scripts/cube-xfs-pool.sh", s.root, ReflinkRequired)
	case s.opts.Reflink == ReflinkAuto:
		s.log.Warn("filesystem cannot reflink: falling back to full copies of parent images (slow, uses disk per container); put root on XFS (reflink=1) or btrfs")
		return imagefile.ModeCopy, nil
	default:
		return "", fmt.Errorf("snapshotter: unknown reflink policy %q (want auto, required or never)", s.opts.Reflink)
	}
}

// Mode reports whether children are reflinks or copies.
func (s *Snapshotter) Mode() imagefile.Mode { return s.mode }

// Root is the absolute root directory.
func (s *Snapshotter) Root() string { return s.root }

func (s *Snapshotter) imagePath(id string) string {
	return filepath.Join(s.imgDir, id+".img")
}

// Stat returns the info of an active, view or committed snapshot.
func (s *Snapshotter) Stat(ctx context.Context, key string) (info snapshots.Info, err error) {
	err = s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		_, info, _, err = storage.GetInfo(ctx, key)
		return err
	})
	if err != nil {
		return snapshots.Info{}, fmt.Errorf("stat %q: %w", key, err)
	}
	return info, nil
}

// Update changes labels (the only mutable field).
func (s *Snapshotter) Update(ctx context.Context, info snapshots.Info, fieldpaths ...string) (_ snapshots.Info, err error) {
	if err := validateSizeLabel(info.Labels); err != nil {
		return snapshots.Info{}, err
	}
	err = s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		info, err = storage.UpdateInfo(ctx, info, fieldpaths...)
		return err
	})
	if err != nil {
		return snapshots.Info{}, fmt.Errorf("update %q: %w", info.Name, err)
	}
	return info, nil
}

// Usage reports the disk space a snapshot uses exclusively (extents shared
// with its parent through reflink are not counted) and the inodes in use.
// Active snapshots are measured now; committed ones were measured at Commit.
func (s *Snapshotter) Usage(ctx context.Context, key string) (usage snapshots.Usage, err error) {
	var (
		id   string
		info snapshots.Info
	)
	err = s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		id, info, usage, err = storage.GetInfo(ctx, key)
		return err
	})
	if err != nil {
		return snapshots.Usage{}, fmt.Errorf("usage %q: %w", key, err)
	}
	if info.Kind == snapshots.KindActive {
		return s.measure(id)
	}
	return usage, nil
}

func (s *Snapshotter) measure(id string) (snapshots.Usage, error) {
	p := s.imagePath(id)
	size, err := imagefile.Exclusive(p)
	if err != nil {
		return snapshots.Usage{}, err
	}
	u := snapshots.Usage{Size: size}
	// The superblock's counters lag while mounted; a best-effort figure is
	// fine for Usage, and a garbled superblock must not fail the call.
	if sb, err := imagefile.ReadSuperblock(p); err == nil {
		u.Inodes = sb.UsedInodes()
	} else {
		s.log.WithError(err).WithField("id", id).Debug("inode count unavailable")
	}
	return u, nil
}

// Prepare creates an active snapshot: a writable image whose contents are the parent's.
func (s *Snapshotter) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	return s.create(ctx, snapshots.KindActive, key, parent, opts)
}

// View creates a read-only snapshot of parent. It shares the committed
// parent's image (mounted ro), so it costs no disk space.
func (s *Snapshotter) View(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	return s.create(ctx, snapshots.KindView, key, parent, opts)
}

// Mounts returns the mounts of an active snapshot or view.
func (s *Snapshotter) Mounts(ctx context.Context, key string) (_ []mount.Mount, err error) {
	var sn storage.Snapshot
	err = s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		sn, err = storage.GetSnapshot(ctx, key)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("mounts %q: %w", key, err)
	}
	return s.mounts(sn), nil
}

func (s *Snapshotter) mounts(sn storage.Snapshot) []mount.Mount {
	src, mode := s.imagePath(sn.ID), "rw"
	if sn.Kind == snapshots.KindView {
		mode = "ro"
		if len(sn.ParentIDs) > 0 {
			// Committed images never change, so a view can read the parent's own file.
			src = s.imagePath(sn.ParentIDs[0])
		}
	}
	opts := []string{"loop", mode}
	if sn.Kind == snapshots.KindActive {
		// An active image may be a running VM's root disk, mounted with its journal in the guest.
		// containerd also mounts it on the host, read-only, to diff it (the rw layer of `ctr task
		// checkpoint`): a read-only loop device cannot replay that journal, and ext4 refuses to mount
		// without noload. noload skips the journal on the host side (unpacking into a fresh image then
		// runs without one: nothing uncommitted survives a crash anyway).
		opts = append(opts, "noload")
	}
	return []mount.Mount{{Type: "ext4", Source: src, Options: opts}}
}

// Commit turns an active snapshot into a committed one named name. The image
// must be unmounted; it is fsynced before the metadata says "committed", so a
// crash never leaves a committed record over unflushed data.
func (s *Snapshotter) Commit(ctx context.Context, name, key string, opts ...snapshots.Opt) error {
	var (
		id   string
		info snapshots.Info
	)
	err := s.ms.WithTransaction(ctx, false, func(ctx context.Context) (err error) {
		id, info, _, err = storage.GetInfo(ctx, key)
		return err
	})
	if err != nil {
		return fmt.Errorf("commit %q as %q: %w", key, name, err)
	}
	if info.Kind != snapshots.KindActive {
		return fmt.Errorf("commit %q as %q: snapshot is %v, not active: %w", key, name, info.Kind, errdefs.ErrFailedPrecondition)
	}
	if err := validateSizeLabel(labelsOf(opts)); err != nil {
		return err
	}
	if err := imagefile.SyncFile(s.imagePath(id)); err != nil {
		return fmt.Errorf("commit %q as %q: %w", key, name, err)
	}
	usage, err := s.measure(id)
	if err != nil {
		return fmt.Errorf("commit %q as %q: %w", key, name, err)
	}
	err = s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		// The record may have changed since the read transaction; CommitActive
		// re-checks kind and existence, and the id must still be the one we synced.
		cid, err := storage.CommitActive(ctx, key, name, usage, opts...)
		if err != nil {
			return err
		}
		if cid != id {
			return fmt.Errorf("snapshot %q changed identity during commit: %w", key, errdefs.ErrAborted)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("commit %q as %q: %w", key, name, err)
	}
	return nil
}

// Remove deletes a snapshot that has no children, and its image.
func (s *Snapshotter) Remove(ctx context.Context, key string) error {
	var path, doomed string
	err := s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		id, _, err := storage.Remove(ctx, key)
		if err != nil {
			return err
		}
		// Rename inside the transaction so a concurrent Prepare cannot clone
		// a parent whose record is gone; the unlink waits for the commit.
		path = s.imagePath(id)
		doomed = filepath.Join(s.imgDir, "rm-"+id+".img")
		if err := os.Rename(path, doomed); err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("rename %s: %w", path, err)
			}
			doomed = "" // a view of a committed parent owns no file
		}
		return nil
	})
	if err != nil {
		if doomed != "" {
			if rerr := os.Rename(doomed, path); rerr != nil {
				s.log.WithError(rerr).WithField("path", doomed).Error("failed to restore image after aborted remove")
			}
		}
		return fmt.Errorf("remove %q: %w", key, err)
	}
	if doomed != "" {
		if err := os.Remove(doomed); err != nil && !errors.Is(err, os.ErrNotExist) {
			// Cleanup (run by containerd's GC and at start) retries it.
			s.log.WithError(err).WithField("path", doomed).Warn("failed to delete removed image")
		}
	}
	return nil
}

// Walk calls fn for every snapshot matching all filters (containerd filter syntax).
func (s *Snapshotter) Walk(ctx context.Context, fn snapshots.WalkFunc, fs ...string) error {
	return s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		return storage.WalkInfo(ctx, fn, fs...)
	})
}

// tempImageOf is the snapshot id of a temporary image name
// (".<id>.img.tmp-<random>", hypervisor/snapshot.CloneFile's).
func tempImageOf(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, ".")
	if !ok {
		return "", false
	}
	id, _, ok := strings.Cut(rest, ".img.tmp-")
	return id, ok && id != ""
}

// Cleanup deletes image files that no snapshot record references: images of
// removed snapshots whose delete failed, and images renamed into place by a
// call whose metadata transaction never committed.
func (s *Snapshotter) Cleanup(ctx context.Context) error {
	var doomed []string
	// A write transaction keeps every create/remove out while we list, so a
	// file renamed into place by an in-flight Prepare is never mistaken for garbage.
	err := s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		ids, err := storage.IDMap(ctx)
		if errdefs.IsNotFound(err) {
			ids = nil // no snapshot was ever created: every file is an orphan
		} else if err != nil {
			return err
		}
		names, err := readDirNames(s.imgDir)
		if err != nil {
			return err
		}
		for _, n := range names {
			if id, ok := strings.CutSuffix(n, ".img"); ok {
				if _, live := ids[id]; live {
					continue
				}
			}
			// A live snapshot's image being replaced by its writer (cube-vmm's
			// restore clones the snapshot's disk into ".<id>.img.tmp-*", then
			// renames it over <id>.img) is no orphan: removing it fails the
			// restore. One of a removed snapshot is.
			if id, ok := tempImageOf(n); ok {
				if _, live := ids[id]; live {
					continue
				}
			}
			doomed = append(doomed, filepath.Join(s.imgDir, n))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	for _, p := range doomed {
		if err := os.RemoveAll(p); err != nil {
			s.log.WithError(err).WithField("path", p).Warn("cleanup: failed to remove orphan image")
			continue
		}
		s.log.WithField("path", p).Info("cleanup: removed orphan image")
	}
	if len(doomed) > 0 {
		if err := imagefile.SyncDir(s.imgDir); err != nil {
			return fmt.Errorf("cleanup: %w", err)
		}
	}
	return nil
}

// Close releases the metadata store. Further calls fail.
func (s *Snapshotter) Close() error {
	s.closeOnce.Do(func() {
		s.closeErr = s.ms.Close()
		s.lock.Close() // releases the flock
	})
	return s.closeErr
}

func lockRoot(root string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(root, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("snapshotter: lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("snapshotter: root %s is in use by another process: %w", root, errdefs.ErrUnavailable)
		}
		return nil, fmt.Errorf("snapshotter: lock %s: %w", root, err)
	}
	return f, nil
}

func readDirNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

func removeAllIn(dir string) (int, error) {
	names, err := readDirNames(dir)
	if err != nil {
		return 0, err
	}
	for _, n := range names {
		if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
			return 0, err
		}
	}
	return len(names), nil
}
