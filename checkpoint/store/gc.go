package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"golang.org/x/sys/unix"
)

// Report says what Collect removed, one line per item, as logged.
type Report struct {
	Removed []string
	// Kept lists leftovers Collect had to keep, with the reason (a snapshot
	// of a dead operation that a live VM still holds).
	Kept []string
}

// Collect removes what crashed or killed processes left behind; Open runs
// it. It removes:
//   - unfinished snapshots (Begin without Commit or Abort) of processes that
//     are gone: the VM snapshot written so far, cube-vmm's temporary
//     directories, their name reservations and records;
//   - snapshots of operations (BeginOptions.Op) whose process is gone before
//     KeepOp or DropOp, unless held or a parent (then kept and logged);
//   - references of processes that are gone (see Reference);
//   - the rest of interrupted deletions (trash/), name links to no snapshot,
//     reference directories of no snapshot, and temporary metadata files.
//
// It never removes a committed snapshot otherwise, nor one whose metadata
// does not validate (List logs those; Delete removes them), nor anything of
// a live process. Each removal is logged (logrus, Info) and reported.
func (s *Store) Collect(ctx context.Context) (Report, error) {
	unlock, err := s.lock(ctx, unix.LOCK_EX)
	if err != nil {
		return Report{}, err
	}
	defer unlock()
	return s.collectLocked()
}

type collector struct {
	s   *Store
	rep Report
}

func (c *collector) removed(what string, fields map[string]any) {
	c.s.log.WithFields(fields).Info("collected: " + what)
	c.rep.Removed = append(c.rep.Removed, what)
}

func (c *collector) kept(what string, err error) {
	c.s.log.WithError(err).Warn("kept: " + what)
	c.rep.Kept = append(c.rep.Kept, what+": "+err.Error())
}

func (s *Store) collectLocked() (Report, error) {
	c := &collector{s: s}
	// Ordering: pending records before the snapshot directories (a
	// directory without a committed snapshot is kept only while a live
	// record says it is being written), operations and references before
	// names (a deleted snapshot's names become stale links).
	for _, step := range []func() error{c.trash, c.pending, c.snapshots, c.ops, c.refs, c.names, c.temps} {
		if err := step(); err != nil {
			return c.rep, fmt.Errorf("store %s: collect: %w", s.root, err)
		}
	}
	return c.rep, nil
}

// trash: the rest of interrupted deletions.
func (c *collector) trash() error {
	dir := filepath.Join(c.s.root, trashDir)
	names, err := readDirNames(dir)
	for _, n := range names {
		if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
			return err
		}
		c.removed("files of deleted snapshot "+n, map[string]any{"id": n})
	}
	return err
}

// pending: the Begins of processes that are gone.
func (c *collector) pending() error {
	s := c.s
	files, err := readDirNames(filepath.Join(s.root, pendingDir))
	for _, f := range files {
		id, ok := strings.CutSuffix(f, ".json")
		if !ok || !isID(id) {
			continue // temps: c.temps
		}
		rec, err := s.readPending(id)
		if err == nil && rec.Owner.alive(s.boot) {
			continue
		}
		what := "unfinished snapshot " + id
		fields := map[string]any{"id": id}
		if err != nil {
			what += " (unreadable record: " + err.Error() + ")"
			rec = &pendingFile{ID: id}
		} else {
			what += fmt.Sprintf(" of sandbox %q, begun by %s at %s", rec.Sandbox, rec.Owner, rec.Begun.Format("2006-01-02T15:04:05Z07:00"))
			fields["sandbox"], fields["owner_pid"], fields["op"] = rec.Sandbox, rec.Owner.PID, rec.Op
		}
		if _, serr := os.Stat(s.metaPath(id)); serr == nil {
			what = "record of committed snapshot " + id
		}
		if err := s.removePendingLocked(rec); err != nil && !errors.Is(err, errCommittedMeanwhile) {
			return err
		}
		c.removed(what, fields)
	}
	return err
}

// vmmTemp matches cube-vmm's temporary directory of snapshot <id>.
var vmmTemp = regexp.MustCompile(`^\.([0-9a-f]{24})\.tmp-`)

// snapshots: directories in snapshots/ that no committed snapshot or live
// Begin accounts for.
func (c *collector) snapshots() error {
	s := c.s
	dir := filepath.Join(s.root, snapsDir)
	names, err := readDirNames(dir)
	for _, n := range names {
		id := n
		if m := vmmTemp.FindStringSubmatch(n); m != nil {
			id = m[1]
		} else if !isID(n) {
			s.log.WithField("path", filepath.Join(dir, n)).Warn("not a snapshot of this store: left alone")
			continue
		} else if _, err := os.Lstat(s.metaPath(n)); !errors.Is(err, fs.ErrNotExist) {
			continue // committed (or unreadable: kept, List and Get say so)
		}
		if _, err := os.Lstat(s.pendingPath(id)); err == nil {
			continue // a live Begin: c.pending removed the others
		}
		if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
			return err
		}
		c.removed("uncommitted VM snapshot directory "+n, map[string]any{"id": id})
	}
	return err
}

// ops: snapshots of operations whose process is gone.
func (c *collector) ops() error {
	s := c.s
	entries, err := s.entriesLocked()
	if err != nil {
		return err
	}
	for i := len(entries) - 1; i >= 0; i-- { // children first
		e := entries[i]
		if e.Op == "" || e.Owner.alive(s.boot) {
			continue
		}
		what := fmt.Sprintf("snapshot %s of unfinished operation %s (%s is gone)", e.ID, e.Op, e.Owner)
		if err := s.deleteLocked(e.ID); err != nil {
			c.kept(what, err)
			continue
		}
		c.removed(what, map[string]any{"id": e.ID, "op": e.Op, "owner_pid": e.Owner.PID})
	}
	return nil
}

// refs: stale references, and reference directories of no snapshot.
func (c *collector) refs() error {
	s := c.s
	dir := filepath.Join(s.root, refsDir)
	ids, err := readDirNames(dir)
	for _, id := range ids {
		if isID(id) {
			if _, err := os.Lstat(s.metaPath(id)); err == nil {
				_, dropped := s.dropStaleLocked(id)
				for _, r := range dropped {
					c.removed(fmt.Sprintf("reference of holder %q to snapshot %s (%s is gone)", r.Holder, id, r.Process), map[string]any{"id": id, "holder": r.Holder, "pid": r.Process.PID})
				}
				continue
			}
		}
		if err := os.RemoveAll(filepath.Join(dir, id)); err != nil {
			return err
		}
		c.removed("references to missing snapshot "+id, map[string]any{"id": id})
	}
	return err
}

// names: links to no committed snapshot and no live Begin.
func (c *collector) names() error {
	s := c.s
	names, err := readDirNames(filepath.Join(s.root, namesDir))
	for _, n := range names {
		if strings.HasPrefix(n, ".") {
			continue
		}
		id, err := s.readName(n)
		if err == nil {
			_, merr := os.Lstat(s.metaPath(id))
			_, perr := os.Lstat(s.pendingPath(id))
			if merr == nil || perr == nil {
				continue
			}
		}
		if err := os.Remove(s.namePath(n)); err != nil {
			return err
		}
		c.removed(fmt.Sprintf("name %q of missing snapshot %s", n, id), map[string]any{"name": n, "id": id})
	}
	return err
}

// temps: temporary files of writeAtomic that a crash left (every writer
// holds the lock, so none is being written now).
func (c *collector) temps() error {
	s := c.s
	dirs := []string{s.root, filepath.Join(s.root, pendingDir), filepath.Join(s.root, namesDir)}
	ids, _ := readDirNames(filepath.Join(s.root, snapsDir))
	for _, id := range ids {
		if isID(id) {
			dirs = append(dirs, s.Dir(id))
		}
	}
	ids, _ = readDirNames(filepath.Join(s.root, refsDir))
	for _, id := range ids {
		dirs = append(dirs, s.refsPath(id))
	}
	for _, d := range dirs {
		tmps, _ := filepath.Glob(filepath.Join(d, ".*.tmp-*"))
		for _, t := range tmps {
			if vmmTemp.MatchString(filepath.Base(t)) {
				continue
			}
			if err := os.Remove(t); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			c.removed("temporary file "+t, map[string]any{"path": t})
		}
	}
	return nil
}
