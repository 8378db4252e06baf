package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Names are symlinks names/<name> -> <id>, created with symlink(2), which
// fails if the name exists: that is what keeps names unique. A link whose id
// is neither a committed snapshot nor one being written by a live process is
// stale: Collect removes it, and a new link may replace it.

// Name gives the snapshot ref (id or name) one more name.
func (s *Store) Name(ctx context.Context, ref, name string) error {
	if err := checkName("name", name); err != nil {
		return fmt.Errorf("store: name snapshot %q: %w", ref, invalid(err))
	}
	unlock, err := s.lock(ctx, unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	id, _, err := s.resolve(ref)
	if err != nil {
		return fmt.Errorf("store: name: %w", err)
	}
	if got, err := s.readName(name); err == nil && got == id {
		return nil
	}
	if err := s.nameFreeLocked(name, id); err != nil {
		return fmt.Errorf("store: name snapshot %s: %w", id, err)
	}
	if n := len(s.namesOf(id)); n >= MaxNames {
		return fmt.Errorf("store: name snapshot %s %q: it has %d names, at most %d (Unname one): %w", id, name, n, MaxNames, errdefs.ErrFailedPrecondition)
	}
	if err := s.linkNameLocked(name, id); err != nil {
		return fmt.Errorf("store: name snapshot %s: %w", id, err)
	}
	s.log.WithFields(map[string]any{"id": id, "name": name}).Info("snapshot named")
	return nil
}

// Unname removes a name (the snapshot stays).
func (s *Store) Unname(ctx context.Context, name string) error {
	if err := checkName("name", name); err != nil {
		return fmt.Errorf("store: unname: %w", invalid(err))
	}
	unlock, err := s.lock(ctx, unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	id, err := s.readName(name)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("store: unname %q: no snapshot has this name: %w", name, errdefs.ErrNotFound)
	}
	if err == nil {
		if rec, perr := s.readPending(id); perr == nil && rec.Owner.alive(s.boot) {
			if _, merr := os.Stat(s.metaPath(id)); merr != nil {
				return fmt.Errorf("store: unname %q: reserved by snapshot %s, being written by %s (wait for its Commit): %w", name, id, rec.Owner, errdefs.ErrFailedPrecondition)
			}
		}
	}
	if err := os.Remove(s.namePath(name)); err != nil {
		return fmt.Errorf("store: unname %q: %w", name, err)
	}
	s.log.WithFields(map[string]any{"id": id, "name": name}).Info("snapshot unnamed")
	return syncDir(filepath.Join(s.root, namesDir))
}

// nameFreeLocked refuses a name that a live snapshot other than forID holds.
func (s *Store) nameFreeLocked(name, forID string) error {
	id, err := s.readName(name)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrCorrupt) || id == forID {
		return nil
	}
	if err != nil {
		return fmt.Errorf("name %q: %w", name, err)
	}
	if _, err := os.Stat(s.metaPath(id)); err == nil {
		return fmt.Errorf("name %q is taken by snapshot %s (Unname it there, or choose another): %w", name, id, errdefs.ErrAlreadyExists)
	}
	if rec, err := s.readPending(id); err == nil && rec.Owner.alive(s.boot) {
		return fmt.Errorf("name %q is reserved by snapshot %s, being written by %s (choose another): %w", name, id, rec.Owner, errdefs.ErrAlreadyExists)
	}
	return nil
}

// linkNameLocked points name at id, replacing a stale link (the caller
// checked with nameFreeLocked).
func (s *Store) linkNameLocked(name, id string) error {
	p := s.namePath(name)
	err := os.Symlink(id, p)
	if errors.Is(err, fs.ErrExist) {
		if err = os.Remove(p); err == nil {
			err = os.Symlink(id, p)
		}
	}
	if err != nil {
		return fmt.Errorf("name %q: %w", name, err)
	}
	return syncDir(filepath.Join(s.root, namesDir))
}

// allNames maps each id to its names (sorted).
func (s *Store) allNames() map[string][]string {
	names, err := readDirNames(filepath.Join(s.root, namesDir))
	if err != nil {
		s.log.WithError(err).Warn("cannot list names")
	}
	out := map[string][]string{}
	for _, n := range names {
		if checkName("name", n) != nil {
			continue
		}
		if id, err := s.readName(n); err == nil {
			out[id] = append(out[id], n)
		}
	}
	for _, v := range out {
		sort.Strings(v)
	}
	return out
}

// namesOf is snapshot id's names (sorted).
func (s *Store) namesOf(id string) []string { return s.allNames()[id] }
