package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// BeginOptions describe a snapshot about to be taken.
type BeginOptions struct {
	// Sandbox is the sandbox the VM runs (required).
	Sandbox string
	// Parent is the id or name of the snapshot this one follows. An
	// incremental VM snapshot's parent is read from its manifest at Commit;
	// naming it here as well protects it from deletion while the child is
	// written. For a full snapshot it is lineage only (the VM was restored or
	// rolled back from it).
	Parent string
	// Names are reserved at Begin (taken names are refused before the VM is
	// snapshotted) and attached at Commit.
	Names []string
	// Op tags the snapshot with an operation (a fork): the snapshot stays
	// tagged after Commit until KeepOp or DropOp, and if this process dies
	// first, the next Collect deletes it.
	Op string
}

// Pending is a snapshot being written: Dir is where cube-vmm writes the VM
// snapshot, Commit makes it visible, Abort removes it. It belongs to the
// process that called Begin: if that process dies, Collect removes it.
type Pending struct {
	s   *Store
	rec pendingFile

	mu   sync.Mutex
	done bool
}

// ID is the id the snapshot will have.
func (p *Pending) ID() string { return p.rec.ID }

// Dir is the VM snapshot directory to write, in the store root. It does not
// exist yet: cube-vmm creates it (under a temporary name, renamed into place
// when complete) and it never moves afterwards, so an incremental snapshot
// of the same VM can follow it beside it.
func (p *Pending) Dir() string { return p.s.Dir(p.rec.ID) }

// Begin reserves an id and the names and returns the Pending whose Dir the VM
// snapshot goes into.
func (s *Store) Begin(ctx context.Context, opts BeginOptions) (*Pending, error) {
	if err := checkBegin(opts); err != nil {
		return nil, fmt.Errorf("store: begin snapshot of sandbox %q: %w", opts.Sandbox, err)
	}
	unlock, err := s.lock(ctx, unix.LOCK_EX)
	if err != nil {
		return nil, err
	}
	defer unlock()
	rec := pendingFile{Version: FormatVersion, Sandbox: opts.Sandbox, Names: opts.Names, Op: opts.Op, Owner: s.self, Begun: time.Now().UTC()}
	if opts.Parent != "" {
		if rec.Parent, _, err = s.resolve(opts.Parent); err != nil {
			return nil, fmt.Errorf("store: begin snapshot of sandbox %q: parent: %w", opts.Sandbox, err)
		}
	}
	for _, n := range opts.Names {
		if err := s.nameFreeLocked(n, ""); err != nil {
			return nil, fmt.Errorf("store: begin snapshot of sandbox %q: %w", opts.Sandbox, err)
		}
	}
	if rec.ID, err = s.freshIDLocked(); err != nil {
		return nil, fmt.Errorf("store: begin snapshot of sandbox %q: %w", opts.Sandbox, err)
	}
	b, err := encode(&rec)
	if err == nil {
		// Ordering: the record before the name links, so that a crash
		// between them leaves a record Collect finds the links by.
		err = writeAtomic(filepath.Join(s.root, pendingDir), rec.ID+".json", b)
	}
	for i := 0; err == nil && i < len(opts.Names); i++ {
		err = s.linkNameLocked(opts.Names[i], rec.ID)
	}
	if err != nil {
		s.removePendingLocked(&rec)
		return nil, fmt.Errorf("store: begin snapshot of sandbox %q: %w", opts.Sandbox, err)
	}
	s.log.WithFields(map[string]any{"id": rec.ID, "sandbox": rec.Sandbox, "op": rec.Op}).Debug("snapshot begun")
	return &Pending{s: s, rec: rec}, nil
}

func checkBegin(opts BeginOptions) error {
	if err := checkText("sandbox", opts.Sandbox); err != nil {
		return invalid(err)
	}
	if len(opts.Names) > MaxNames {
		return invalid(fmt.Errorf("%d names, at most %d", len(opts.Names), MaxNames))
	}
	seen := map[string]bool{}
	for _, n := range opts.Names {
		if err := checkName("name", n); err != nil {
			return invalid(err)
		}
		if seen[n] {
			return invalid(fmt.Errorf("name %q given twice", n))
		}
		seen[n] = true
	}
	if opts.Op != "" {
		if err := checkName("op", opts.Op); err != nil {
			return invalid(err)
		}
	}
	return nil
}

// freshIDLocked returns an id that nothing in the root uses.
func (s *Store) freshIDLocked() (string, error) {
	for range 4 {
		id, err := newID()
		if err != nil {
			return "", err
		}
		_, err1 := os.Lstat(s.Dir(id))
		_, err2 := os.Lstat(s.pendingPath(id))
		if errors.Is(err1, fs.ErrNotExist) && errors.Is(err2, fs.ErrNotExist) {
			return id, nil
		}
	}
	return "", errors.New("no unused snapshot id in 4 tries")
}

// Commit makes the snapshot visible: it checks the VM snapshot in Dir (it
// must open as hypervisor/snapshot's format), reads its kind and parent, and
// writes its metadata. After an error the snapshot is still pending: Abort it.
func (p *Pending) Commit(ctx context.Context) (Snapshot, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, id := p.s, p.rec.ID
	if p.done {
		return Snapshot{}, fmt.Errorf("store: snapshot %s: already committed or aborted: %w", id, errdefs.ErrFailedPrecondition)
	}
	e, err := p.inspect()
	if err != nil {
		return Snapshot{}, fmt.Errorf("store: commit snapshot %s: %w", id, err)
	}
	unlock, err := s.lock(ctx, unix.LOCK_EX)
	if err != nil {
		return Snapshot{}, err
	}
	defer unlock()
	if err := p.checkCommitLocked(e); err != nil {
		return Snapshot{}, fmt.Errorf("store: commit snapshot %s: %w", id, err)
	}
	e.Created = time.Now().UTC()
	b, err := encode(e)
	if err == nil {
		// Ordering: this rename is the commit; the snapshot is visible,
		// with the names linked at Begin, from here on.
		err = writeAtomic(p.Dir(), MetaName, b)
	}
	if err != nil {
		if _, serr := os.Stat(s.metaPath(id)); serr != nil {
			return Snapshot{}, fmt.Errorf("store: commit snapshot %s: %w", id, err)
		}
		s.log.WithError(err).WithField("id", id).Warn("snapshot committed, but its metadata may not be durable yet")
	}
	p.done = true
	// A crash before this removal leaves the record of a committed
	// snapshot: Collect removes the record and nothing else.
	if err := os.Remove(s.pendingPath(id)); err != nil {
		s.log.WithError(err).WithField("id", id).Warn("snapshot committed; its pending record stays until the next Collect")
	}
	s.log.WithFields(map[string]any{"id": id, "sandbox": e.Sandbox, "kind": e.Kind, "parent": e.Parent, "size": e.Size}).Info("snapshot committed")
	return s.snapshotOf(e, s.namesOf(id), nil), nil
}

// inspect opens the VM snapshot and makes the metadata from it and the record.
func (p *Pending) inspect() (*entryFile, error) {
	dir := p.Dir()
	vs, err := snapshot.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(dir); errors.Is(serr, fs.ErrNotExist) {
			return nil, fmt.Errorf("nothing at %s: have cube-vmm write the VM snapshot there (its snapshot op with this dir) before Commit: %w", dir, errdefs.ErrFailedPrecondition)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("the VM snapshot does not open (Abort, and take it again): %w: %w", err, errdefs.ErrFailedPrecondition)
	}
	kind, parent, err := lineage(vs.Manifest)
	if err != nil {
		return nil, fmt.Errorf("VM snapshot %s: %w: %w", dir, err, errdefs.ErrFailedPrecondition)
	}
	if p.rec.Parent != "" && kind == Incremental && parent != p.rec.Parent {
		return nil, fmt.Errorf("the VM wrote an incremental snapshot over %s, but Begin named parent %s (Abort; give Begin the VM's last snapshot): %w", parent, p.rec.Parent, errdefs.ErrFailedPrecondition)
	}
	if parent == "" {
		parent = p.rec.Parent
	}
	size, err := diskUsage(dir)
	if err != nil {
		return nil, fmt.Errorf("size of %s: %w", dir, err)
	}
	e := &entryFile{Version: FormatVersion, ID: p.rec.ID, Sandbox: p.rec.Sandbox, Parent: parent, Kind: kind, Size: size}
	if p.rec.Op != "" {
		owner := p.rec.Owner
		e.Op, e.Owner = p.rec.Op, &owner
	}
	return e, nil
}

// checkCommitLocked: the record is still there (Collect did not take this
// process for dead) and the parent is still a committed snapshot.
func (p *Pending) checkCommitLocked(e *entryFile) error {
	if _, err := p.s.readPending(e.ID); err != nil {
		return fmt.Errorf("its pending record is gone or unreadable (%v): Abort, and take it again: %w", err, errdefs.ErrFailedPrecondition)
	}
	if e.Parent != "" {
		if _, err := p.s.readEntry(e.Parent); err != nil {
			return fmt.Errorf("parent %s: %v (an incremental snapshot needs its parent's files; take a full one): %w", e.Parent, err, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// lineage reads a manifest's kind and, for an incremental snapshot, its
// parent: the directory of the layer before its own, ../<parent>/memory.bin.
func lineage(m *snapshot.Manifest) (Kind, string, error) {
	own := m.Memory[len(m.Memory)-1]
	if filepath.Base(own.File) != own.File {
		return "", "", fmt.Errorf("its own memory layer %q is not in its directory", own.File)
	}
	if len(m.Memory) == 1 {
		return Full, "", nil
	}
	var parent string
	for i, l := range m.Memory[:len(m.Memory)-1] {
		parts := strings.Split(l.File, "/")
		if len(parts) != 3 || parts[0] != ".." || !isID(parts[1]) {
			return "", "", fmt.Errorf("memory layer %d (%s) is not a layer of another snapshot of this store", i, l.File)
		}
		parent = parts[1]
	}
	return Incremental, parent, nil
}

// Abort removes the pending snapshot: the VM snapshot written so far, its
// name reservations and its record. Call it after cube-vmm's snapshot op
// returned (it removes what cube-vmm writes). It is a no-op after Commit or
// Abort, so `defer p.Abort(ctx)` is the usual form. It ignores ctx's
// cancellation (cleaning up is not optional).
func (p *Pending) Abort(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return nil
	}
	unlock, err := p.s.lock(context.WithoutCancel(ctx), unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	if err := p.s.removePendingLocked(&p.rec); err != nil {
		return fmt.Errorf("store: abort snapshot %s: %w", p.rec.ID, err)
	}
	p.done = true
	p.s.log.WithField("id", p.rec.ID).Debug("snapshot aborted")
	return nil
}

var errCommittedMeanwhile = errors.New("it was committed meanwhile: Delete it instead")

// removePendingLocked removes what Begin and cube-vmm made for rec. A
// snapshot that was committed meanwhile keeps everything but the record.
func (s *Store) removePendingLocked(rec *pendingFile) error {
	id := rec.ID
	_, err := os.Stat(s.metaPath(id))
	committed := err == nil
	if !committed {
		// Ordering: the files and links first, the record last, so that a
		// crash in between leaves the record Collect finishes the job by.
		if err := os.RemoveAll(s.Dir(id)); err != nil {
			return err
		}
		tmps, _ := filepath.Glob(filepath.Join(s.root, snapsDir, "."+id+".tmp-*"))
		for _, t := range tmps {
			if err := os.RemoveAll(t); err != nil {
				return err
			}
		}
		for _, n := range rec.Names {
			if got, err := s.readName(n); err == nil && got == id {
				os.Remove(s.namePath(n))
			}
		}
	}
	if err := os.Remove(s.pendingPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if committed {
		return fmt.Errorf("%w: %w", errCommittedMeanwhile, errdefs.ErrFailedPrecondition)
	}
	return nil
}
