package store

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Snapshot is a committed snapshot as the store knows it.
type Snapshot struct {
	ID      string
	Names   []string // sorted
	Sandbox string   // the sandbox whose VM it is
	Parent  string   // id of the snapshot it follows ("": none)
	Kind    Kind
	// Size is the space its own files occupy on disk (allocated blocks:
	// holes not counted; disk copies reflinked from the live disk counted in
	// full). An incremental snapshot also maps its ancestors' files.
	Size    int64
	Created time.Time // when Commit made it visible
	// Dir is the VM snapshot directory (hypervisor/snapshot's format): what
	// cube-vmm restores and rolls back from.
	Dir string
	// Op is the unfinished operation it belongs to ("": none).
	Op      string
	Holders []Reference // stale ones included until dropped
}

func (s *Store) snapshotOf(e *entryFile, names []string, refs []Reference) Snapshot {
	return Snapshot{
		ID: e.ID, Names: names, Sandbox: e.Sandbox, Parent: e.Parent, Kind: e.Kind,
		Size: e.Size, Created: e.Created, Dir: s.Dir(e.ID), Op: e.Op, Holders: refs,
	}
}

// Get returns the snapshot with id or name ref. A snapshot whose metadata
// does not validate is refused with ErrCorrupt (errdefs.IsDataLoss).
func (s *Store) Get(ctx context.Context, ref string) (Snapshot, error) {
	unlock, err := s.lock(ctx, unix.LOCK_SH)
	if err != nil {
		return Snapshot{}, err
	}
	defer unlock()
	id, e, err := s.resolve(ref)
	if err != nil {
		return Snapshot{}, fmt.Errorf("store: %w", err)
	}
	return s.snapshotOf(e, s.namesOf(id), s.readRefs(id)), nil
}

// ListOptions select and page snapshots.
type ListOptions struct {
	Sandbox string // only this sandbox's snapshots
	Name    string // only the snapshot with this name
	// Limit is the most snapshots to return (0: all). With a limit, List
	// returns a token for the next page ("" after the last).
	Limit int
	// Token is the token of the previous page ("" for the first).
	Token string
}

// List returns the committed snapshots, oldest first (by creation time,
// then id), and the token of the next page. Pages are stable: a snapshot
// committed while a caller pages comes after the pages already returned, and
// one deleted meanwhile is missing without shifting the others. Snapshots
// whose metadata does not validate are left out (and logged); Get names the
// problem.
func (s *Store) List(ctx context.Context, opts ListOptions) ([]Snapshot, string, error) {
	after, err := parseToken(opts.Token)
	if err != nil {
		return nil, "", fmt.Errorf("store: list: %w", err)
	}
	if opts.Limit < 0 {
		return nil, "", fmt.Errorf("store: list: limit %d is negative (0 means all): %w", opts.Limit, errdefs.ErrInvalidArgument)
	}
	unlock, err := s.lock(ctx, unix.LOCK_SH)
	if err != nil {
		return nil, "", err
	}
	defer unlock()
	entries, err := s.entriesLocked()
	if err != nil {
		return nil, "", fmt.Errorf("store: list: %w", err)
	}
	names := s.allNames()
	var out []Snapshot
	for _, e := range entries {
		if opts.Sandbox != "" && e.Sandbox != opts.Sandbox || opts.Name != "" && !contains(names[e.ID], opts.Name) {
			continue
		}
		if after != nil && !after.before(e) {
			continue
		}
		if opts.Limit > 0 && len(out) == opts.Limit {
			return out, makeToken(out[len(out)-1]), nil
		}
		out = append(out, s.snapshotOf(e, names[e.ID], s.readRefs(e.ID)))
	}
	return out, "", nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// entriesLocked reads every committed snapshot's metadata, in list order,
// leaving out (and logging) those that do not validate.
func (s *Store) entriesLocked() ([]*entryFile, error) {
	ids, err := readDirNames(filepath.Join(s.root, snapsDir))
	if err != nil {
		return nil, err
	}
	var out []*entryFile
	for _, id := range ids {
		if !isID(id) {
			continue
		}
		e, err := s.readEntry(id)
		if errors.Is(err, fs.ErrNotExist) {
			continue // being written, or left over
		}
		if err != nil {
			s.log.WithError(err).WithField("id", id).Warn("snapshot left out: its metadata does not validate (Get says why; Delete removes it)")
			continue
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return posOf(out[i]).less(posOf(out[j])) })
	return out, nil
}

// position is a snapshot's place in list order; a page token holds the last
// position returned.
type position struct {
	created int64 // UnixNano
	id      string
}

func posOf(e *entryFile) position { return position{e.Created.UnixNano(), e.ID} }

func (p position) less(q position) bool {
	return p.created < q.created || p.created == q.created && p.id < q.id
}

// before says whether p comes before e.
func (p *position) before(e *entryFile) bool { return p.less(posOf(e)) }

const tokenPrefix = "v1:"

func makeToken(last Snapshot) string {
	return base64.RawURLEncoding.EncodeToString([]byte(tokenPrefix + strconv.FormatInt(last.Created.UnixNano(), 10) + ":" + last.ID))
}

func parseToken(t string) (*position, error) {
	if t == "" {
		return nil, nil
	}
	bad := fmt.Errorf("token %q is not one List returned (start again without a token): %w", t, errdefs.ErrInvalidArgument)
	if len(t) > 128 {
		return nil, bad
	}
	b, err := base64.RawURLEncoding.DecodeString(t)
	if err != nil || !strings.HasPrefix(string(b), tokenPrefix) {
		return nil, bad
	}
	created, id, ok := strings.Cut(strings.TrimPrefix(string(b), tokenPrefix), ":")
	n, err := strconv.ParseInt(created, 10, 64)
	if !ok || err != nil || !isID(id) {
		return nil, bad
	}
	return &position{created: n, id: id}, nil
}
