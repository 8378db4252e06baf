package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// Delete removes snapshot ref (id or name), its names and its files. It is
// refused, never deferred, while the snapshot is held (a live reference: a
// VM maps its memory files) or is the parent of another snapshot (committed,
// or being written by a live process): the error (errdefs.IsFailedPrecondition)
// names the holders or the children and what to do. A snapshot whose
// metadata does not validate (ErrCorrupt, ErrVersion) can be deleted too.
func (s *Store) Delete(ctx context.Context, ref string) error {
	unlock, err := s.lock(ctx, unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	id, _, err := s.resolve(ref)
	if err != nil && (id == "" || !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrVersion)) {
		return fmt.Errorf("store: delete: %w", err)
	}
	if err := s.deleteLocked(id); err != nil {
		return fmt.Errorf("store: delete: %w", err)
	}
	return nil
}

// deleteLocked refuses or deletes snapshot id (see Delete).
func (s *Store) deleteLocked(id string) error {
	what := "snapshot " + id
	if names := s.namesOf(id); len(names) > 0 {
		what += " (" + strings.Join(names, ", ") + ")"
	}
	live, dropped := s.dropStaleLocked(id)
	for _, r := range dropped {
		s.log.WithFields(map[string]any{"id": id, "holder": r.Holder, "pid": r.Process.PID}).Info("dropped the reference of a process that is gone")
	}
	if len(live) > 0 {
		return fmt.Errorf("%s is in use, held by %s: release it (Release, or stop the VM that maps it) and delete again: %w", what, joinRefs(live), errdefs.ErrFailedPrecondition)
	}
	children, writing := s.childrenLocked(id)
	if len(children) > 0 {
		return fmt.Errorf("%s is the parent of %s: delete those first: %w", what, strings.Join(children, ", "), errdefs.ErrFailedPrecondition)
	}
	if len(writing) > 0 {
		return fmt.Errorf("%s is the parent of %s, being written: wait for its Commit or Abort, then delete it first: %w", what, strings.Join(writing, ", "), errdefs.ErrFailedPrecondition)
	}
	trash := filepath.Join(s.root, trashDir, id)
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	// Ordering: the rename out of snapshots/ is the deletion: the snapshot
	// is gone for every reader at once, and a crash after it leaves only
	// trash/, stale name links and references, which Collect removes.
	if err := os.Rename(s.Dir(id), trash); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := syncDir(filepath.Join(s.root, snapsDir)); err != nil {
		s.log.WithError(err).WithField("id", id).Warn("deleted snapshot's directory rename may not be durable yet")
	}
	for _, n := range s.namesOf(id) {
		os.Remove(s.namePath(n))
	}
	os.RemoveAll(s.refsPath(id))
	if err := os.RemoveAll(trash); err != nil {
		s.log.WithError(err).WithField("id", id).Warn("deleted snapshot's files stay in trash/ until the next Collect")
	}
	s.log.WithField("id", id).Info("snapshot deleted")
	return nil
}

func joinRefs(refs []Reference) string {
	var b []string
	for _, r := range refs {
		b = append(b, r.String())
	}
	return strings.Join(b, ", ")
}

// childrenLocked lists the committed snapshots whose parent is id, and the
// pending ones (of live processes) that named id as their parent. A child
// whose metadata does not validate counts when its VM manifest uses id's
// memory files.
func (s *Store) childrenLocked(id string) (children, writing []string) {
	ids, _ := readDirNames(filepath.Join(s.root, snapsDir))
	for _, c := range ids {
		if !isID(c) || c == id {
			continue
		}
		e, err := s.readEntry(c)
		switch {
		case err == nil && e.Parent == id:
			children = append(children, c)
		case err != nil && !errors.Is(err, fs.ErrNotExist) && s.usesFiles(c, id):
			children = append(children, c+" (metadata unreadable)")
		}
	}
	recs, _ := readDirNames(filepath.Join(s.root, pendingDir))
	for _, f := range recs {
		c, ok := strings.CutSuffix(f, ".json")
		if !ok || !isID(c) {
			continue
		}
		if rec, err := s.readPending(c); err == nil && rec.Parent == id && rec.Owner.alive(s.boot) {
			if _, err := os.Stat(s.metaPath(c)); err != nil {
				writing = append(writing, c+" (by "+rec.Owner.String()+")")
			}
		}
	}
	sort.Strings(children)
	sort.Strings(writing)
	return children, writing
}

// usesFiles says whether the VM snapshot of c maps files of snapshot id.
func (s *Store) usesFiles(c, id string) bool {
	b, err := readFile(filepath.Join(s.Dir(c), snapshot.ManifestName), 1<<20)
	if err != nil {
		return false
	}
	m, err := snapshot.ParseManifest(b)
	if err != nil {
		return false
	}
	for _, l := range m.Memory {
		if strings.HasPrefix(l.File, "../"+id+"/") || strings.HasPrefix(l.Bitmap, "../"+id+"/") {
			return true
		}
	}
	return false
}

// KeepOp ends operation op keeping its snapshots: they lose the tag and
// become ordinary snapshots. It returns their ids.
func (s *Store) KeepOp(ctx context.Context, op string) ([]string, error) {
	if err := checkName("op", op); err != nil {
		return nil, fmt.Errorf("store: keep op: %w", invalid(err))
	}
	unlock, err := s.lock(ctx, unix.LOCK_EX)
	if err != nil {
		return nil, err
	}
	defer unlock()
	entries, err := s.entriesLocked()
	if err != nil {
		return nil, fmt.Errorf("store: keep op %s: %w", op, err)
	}
	var kept []string
	for _, e := range entries {
		if e.Op != op {
			continue
		}
		e.Op, e.Owner = "", nil
		b, err := encode(e)
		if err == nil {
			err = writeAtomic(s.Dir(e.ID), MetaName, b)
		}
		if err != nil {
			return kept, fmt.Errorf("store: keep op %s: snapshot %s: %w", op, e.ID, err)
		}
		kept = append(kept, e.ID)
	}
	s.log.WithFields(map[string]any{"op": op, "snapshots": kept}).Info("operation ended, snapshots kept")
	return kept, nil
}

// DropOp ends operation op deleting its snapshots, children before parents.
// It returns the ids deleted; those it must refuse (see Delete) stay tagged
// and are named in the error.
func (s *Store) DropOp(ctx context.Context, op string) ([]string, error) {
	if err := checkName("op", op); err != nil {
		return nil, fmt.Errorf("store: drop op: %w", invalid(err))
	}
	unlock, err := s.lock(ctx, unix.LOCK_EX)
	if err != nil {
		return nil, err
	}
	defer unlock()
	deleted, err := s.dropOpLocked(func(e *entryFile) bool { return e.Op == op })
	if err != nil {
		return deleted, fmt.Errorf("store: drop op %s: %w", op, err)
	}
	return deleted, nil
}

// dropOpLocked deletes the snapshots match selects, newest first (a child
// is committed after its parent), and joins the refusals.
func (s *Store) dropOpLocked(match func(*entryFile) bool) ([]string, error) {
	entries, err := s.entriesLocked()
	if err != nil {
		return nil, err
	}
	var deleted []string
	var errs []error
	for i := len(entries) - 1; i >= 0; i-- {
		if e := entries[i]; match(e) {
			if err := s.deleteLocked(e.ID); err != nil {
				errs = append(errs, err)
				continue
			}
			deleted = append(deleted, e.ID)
		}
	}
	return deleted, errors.Join(errs...)
}
