package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// SnapshotterRoot is cube-snapshotter's default root (snapshotter/service's
// DefaultRoot, repeated here: checkpoint/ does not import the snapshotter).
// It is where the reflink pool is mounted (contrib/scripts/cube-xfs-pool.sh,
// docs/snapshotter.md): an XFS with reflink=1 or a btrfs.
const SnapshotterRoot = "/var/lib/cube-snapshotter"

// DefaultRoot is the store's default root: a directory on the snapshotter's
// reflink pool, beside the snapshotter's own files. cube-vmm reflinks (FICLONE)
// a running VM's writable disks into its snapshot, and a reflink only works
// within one filesystem: with the store on the pool that holds the
// containers' root images, a disk copy costs no time and no space until
// either side writes. Elsewhere cube-vmm copies the disks in full. The
// snapshotter removes only what it does not know in its own snapshots/ and
// tmp/, never this directory.
const DefaultRoot = SnapshotterRoot + "/vm-snapshots"

// RootBeside is the store root on the pool of a snapshotter whose root is
// snapshotterRoot (DefaultRoot for the default one).
func RootBeside(snapshotterRoot string) string {
	return filepath.Join(snapshotterRoot, "vm-snapshots")
}

// Names inside the root (doc.go has the layout).
const (
	versionFile = "store-version"
	lockFile    = "lock"
	snapsDir    = "snapshots"
	pendingDir  = "pending"
	namesDir    = "names"
	refsDir     = "refs"
	trashDir    = "trash"
	// MetaName is the store's metadata file inside a VM snapshot directory.
	MetaName = "cube-store.json"
)

// Options configure Open.
type Options struct {
	// Log receives what the store removes and refuses; default: logrus's
	// standard logger.
	Log *logrus.Entry
}

// Store is a snapshot store on one root. Its methods are safe for concurrent
// use, and several Stores (in one process or in several) may share a root:
// every mutation holds an exclusive flock on the root's lock file, every
// read a shared one, and nothing is cached in memory between calls. A Store
// holds no open file between calls: there is nothing to close.
type Store struct {
	root string
	boot string // this boot's id
	self Process
	log  *logrus.Entry
}

// Open opens the store at root, creating it if needed, and collects the
// leftovers of crashed processes (Collect). A root of another store format
// version is refused.
func Open(ctx context.Context, root string, opts Options) (*Store, error) {
	if root == "" {
		return nil, fmt.Errorf("store: no root directory given (the default is %s): %w", DefaultRoot, errdefs.ErrInvalidArgument)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("store: root %q: %w", root, err)
	}
	s := &Store{root: abs, log: opts.Log}
	if s.log == nil {
		s.log = logrus.NewEntry(logrus.StandardLogger())
	}
	s.log = s.log.WithField("store", abs)
	if s.boot, err = readBootID(); err != nil {
		return nil, fmt.Errorf("store %s: %w", abs, err)
	}
	if s.self, err = processOf(os.Getpid(), s.boot); err != nil {
		return nil, fmt.Errorf("store %s: this process: %w", abs, err)
	}
	for _, d := range []string{"", snapsDir, pendingDir, namesDir, refsDir, trashDir} {
		if err := os.MkdirAll(filepath.Join(abs, d), 0o700); err != nil {
			return nil, fmt.Errorf("store %s: %w", abs, err)
		}
	}
	unlock, err := s.lock(ctx, unix.LOCK_EX)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := s.checkVersion(); err != nil {
		return nil, err
	}
	if _, err := s.collectLocked(); err != nil {
		return nil, err
	}
	return s, nil
}

// Root is the store's absolute root directory.
func (s *Store) Root() string { return s.root }

// checkVersion reads the root's store-version, writing it in a new root.
func (s *Store) checkVersion() error {
	p := filepath.Join(s.root, versionFile)
	b, err := readFile(p, 16)
	if errors.Is(err, fs.ErrNotExist) {
		return writeAtomic(s.root, versionFile, []byte(strconv.Itoa(FormatVersion)+"\n"))
	}
	if err != nil {
		return fmt.Errorf("store %s: %w", s.root, err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || len(b) > 16 {
		return fmt.Errorf("store %s: %s holds %q, not a version number (restore it or start a new root): %w", s.root, p, b, ErrCorrupt)
	}
	if v != FormatVersion {
		return fmt.Errorf("store %s is format version %d, this build reads %d (use a cube of that version, or a new root): %w", s.root, v, FormatVersion, ErrVersion)
	}
	return nil
}

// lock takes the root's flock (unix.LOCK_EX or LOCK_SH) on a descriptor of
// its own, so that goroutines of one process exclude each other as processes
// do. It waits until ctx is done.
func (s *Store) lock(ctx context.Context, how int) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(s.root, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store %s: lock: %w", s.root, err)
	}
	wait := time.Millisecond
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil // closing releases the flock
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("store %s: lock: %w", s.root, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			f.Close()
			return nil, fmt.Errorf("store %s: waiting for the lock: %w", s.root, ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// Paths.

// Dir is the VM snapshot directory of snapshot id.
func (s *Store) Dir(id string) string      { return filepath.Join(s.root, snapsDir, id) }
func (s *Store) metaPath(id string) string { return filepath.Join(s.Dir(id), MetaName) }
func (s *Store) pendingPath(id string) string {
	return filepath.Join(s.root, pendingDir, id+".json")
}
func (s *Store) namePath(name string) string { return filepath.Join(s.root, namesDir, name) }
func (s *Store) refsPath(id string) string   { return filepath.Join(s.root, refsDir, id) }

// readEntry reads snapshot id's metadata. fs.ErrNotExist: not committed.
func (s *Store) readEntry(id string) (*entryFile, error) {
	p := s.metaPath(id)
	b, err := readFile(p, maxEntryFile)
	if err != nil {
		return nil, err
	}
	e, err := parseEntry(b)
	if err == nil && e.ID != id {
		err = corrupt(fmt.Errorf("id %s in the directory of %s", e.ID, id))
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return e, nil
}

// readPending reads pending/<id>.json. fs.ErrNotExist: no such Begin.
func (s *Store) readPending(id string) (*pendingFile, error) {
	p := s.pendingPath(id)
	b, err := readFile(p, maxPendingFile)
	if err != nil {
		return nil, err
	}
	rec, err := parsePending(b)
	if err == nil && rec.ID != id {
		err = corrupt(fmt.Errorf("id %s in the file of %s", rec.ID, id))
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return rec, nil
}

// readName is the id name points at ("" with fs.ErrNotExist: no such name).
func (s *Store) readName(name string) (string, error) {
	id, err := os.Readlink(s.namePath(name))
	if err != nil {
		return "", err
	}
	if !isID(id) {
		return "", fmt.Errorf("name link %s points at %q, not a snapshot id: %w", s.namePath(name), id, ErrCorrupt)
	}
	return id, nil
}

// resolve turns an id or a name into the id of a committed snapshot and its
// metadata. Errors: InvalidArgument, NotFound, or a corrupt entry's DataLoss
// (with the id, so that it can still be deleted).
func (s *Store) resolve(ref string) (string, *entryFile, error) {
	id := ref
	if !isID(ref) {
		if err := checkName("snapshot", ref); err != nil {
			return "", nil, invalid(fmt.Errorf("%w (give a snapshot id or name)", err))
		}
		var err error
		if id, err = s.readName(ref); errors.Is(err, fs.ErrNotExist) {
			return "", nil, fmt.Errorf("snapshot %q: no snapshot has this id or name (list them with List): %w", ref, errdefs.ErrNotFound)
		} else if err != nil {
			return "", nil, fmt.Errorf("snapshot %q: %w", ref, err)
		}
	}
	e, err := s.readEntry(id)
	if errors.Is(err, fs.ErrNotExist) {
		what := "no snapshot has this id or name (list them with List)"
		if id != ref {
			what = "its name points at " + id + ", which is not (or not yet) a committed snapshot"
		}
		return "", nil, fmt.Errorf("snapshot %q: %s: %w", ref, what, errdefs.ErrNotFound)
	}
	if err != nil {
		return id, nil, fmt.Errorf("snapshot %s: %w (delete it, or restore the file)", id, err)
	}
	return id, e, nil
}
