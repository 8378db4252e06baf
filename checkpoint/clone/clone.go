package clone

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/checkpoint/snapshots"
	"github.com/cube-runtime/cube/checkpoint/store"
)

// Labels the containers made here carry.
const (
	// LabelRestoredFrom is the store snapshot a container was restored from.
	LabelRestoredFrom = "io.cube.restored-from"
	// LabelFork is the fork operation that made a clone.
	LabelFork = "io.cube.fork"
	// LabelForkedFrom is a clone's source container.
	LabelForkedFrom = "io.cube.forked-from"
)

// MaxClones bounds a fork (as CubeSandbox's API: 1..100).
const MaxClones = 100

// Restored is a container restored from a store snapshot.
type Restored struct {
	ID       string
	Snapshot store.Snapshot
	// Pid is its task's (its VMM's) pid.
	Pid  uint32
	Took time.Duration
}

// Restore makes container id (namespace ns) from the store's snapshot ref:
// the container its record describes, with a task restored from the
// snapshot's directory in place (no copy: the VM maps its memory files). The
// new sandbox holds a reference to the snapshot in the store while its VMM
// lives, so deleting the snapshot is refused meanwhile.
func Restore(ctx context.Context, st *store.Store, m Maker, ns, ref, id string) (Restored, error) {
	start := time.Now()
	snap, err := st.Get(ctx, ref)
	if errdefs.IsNotFound(err) {
		return Restored{}, fmt.Errorf("restore %s: no snapshot %q in the store at %s (`cube snapshots ls` lists them; another store: --store-root): %w", id, ref, st.Root(), err)
	}
	if err != nil {
		return Restored{}, fmt.Errorf("restore %s: %w", id, err)
	}
	rec, err := ReadRecord(snap.Dir)
	if err != nil {
		return Restored{}, fmt.Errorf("restore %s: %w", id, err)
	}
	holder := snapshots.Holder(snapshots.SandboxKey(ns, id))
	// Ordering: the reference is taken (for this process's life) before the
	// VM maps the files, then handed to the VMM's life once it runs.
	if err := st.Acquire(ctx, snap.ID, store.Holder{Name: holder}); err != nil {
		return Restored{}, fmt.Errorf("restore %s: %w", id, err)
	}
	pid, err := m.Make(ctx, id, rec, snap.Dir, map[string]string{LabelRestoredFrom: snap.ID})
	if err != nil {
		if rerr := st.Release(context.WithoutCancel(ctx), snap.ID, holder); rerr != nil {
			err = errors.Join(err, fmt.Errorf("and releasing its reference to %s failed (the store's next start drops it): %w", snap.ID, rerr))
		}
		return Restored{}, err
	}
	if err := st.Acquire(context.WithoutCancel(ctx), snap.ID, store.Holder{Name: holder, PID: int(pid)}); err != nil {
		return Restored{ID: id, Snapshot: snap, Pid: pid}, fmt.Errorf("restored %s, but its reference to snapshot %s could not follow its VMM (pid %d): %w", id, snap.ID, pid, err)
	}
	return Restored{ID: id, Snapshot: snap, Pid: pid, Took: time.Since(start)}, nil
}

// ForkOptions say what to fork.
type ForkOptions struct {
	// Container is the source: a running io.cube.v1 container.
	Container string
	// Sandbox is the store's name of its sandbox (snapshots.SandboxKey).
	Sandbox string
	// N clones, 1..MaxClones.
	N int
	// Prefix names the clones Prefix-1 … Prefix-N.
	Prefix string
	// AllOrNothing removes the clones made when one fails.
	AllOrNothing bool
}

// CloneResult is one clone's outcome.
type CloneResult struct {
	ID   string
	Pid  uint32
	Took time.Duration
	// Err is why it was not made; Removed says it was made, then removed
	// (all-or-nothing after another clone failed).
	Err     error
	Removed bool
}

// Forked is a fork's outcome.
type Forked struct {
	// Op is the fork's operation id; Snapshot its temporary snapshot (gone
	// when Fork returns).
	Op       string
	Snapshot string
	// SnapshotTook is the source's snapshot; the source ran on throughout.
	SnapshotTook time.Duration
	Clones       []CloneResult
	// Warnings: cleanups that failed (the store's next start collects the
	// snapshot; a clone that could not be removed is named).
	Warnings []string
	Took     time.Duration
}

// Failed counts the clones that were not made (or were removed).
func (f Forked) Failed() int {
	n := 0
	for _, c := range f.Clones {
		if c.Err != nil || c.Removed {
			n++
		}
	}
	return n
}

// Fork makes o.N clones of the running container o.Container: one snapshot
// of its VM into the store (temporary, tagged with the fork's operation),
// then N containers whose tasks restore that snapshot in place (each VM maps
// the same memory files: pages shared through the page cache until written;
// each rootfs a reflink of the snapshot's disk), each with its own id,
// rootfs snapshot and cgroup, its guest's clock stepped and RNG reseeded by
// the shim. The source runs on. The temporary snapshot is deleted before
// Fork returns (the clones' VMs keep the files they map), and if this
// process dies first the store's next start deletes it. With AllOrNothing,
// a clone that fails stops the fork and the clones made are removed.
func Fork(ctx context.Context, st *store.Store, sh snapshots.Shim, m Maker, o ForkOptions) (out Forked, err error) {
	start := time.Now()
	if o.N < 1 || o.N > MaxClones {
		return Forked{}, fmt.Errorf("fork of %s: %d clones: want 1..%d: %w", o.Container, o.N, MaxClones, errdefs.ErrInvalidArgument)
	}
	if o.Prefix == "" {
		return Forked{}, fmt.Errorf("fork of %s: no prefix for the clones' ids: %w", o.Container, errdefs.ErrInvalidArgument)
	}
	fin, ok := m.(Finisher)
	if !ok {
		return Forked{}, fmt.Errorf("fork of %s: this maker cannot mark clones as finished", o.Container)
	}
	rec, err := m.Record(ctx, o.Container)
	if err != nil {
		return Forked{}, fmt.Errorf("fork of %s: %w", o.Container, err)
	}
	op, err := newOp()
	if err != nil {
		return Forked{}, err
	}
	out.Op = op
	pending, err := pendingValue(op)
	if err != nil {
		return Forked{}, err
	}
	snapStart := time.Now()
	taken, err := snapshots.Take(ctx, st, sh, snapshots.Options{Container: o.Container, Sandbox: o.Sandbox, Op: op})
	if err != nil {
		return out, fmt.Errorf("fork of %s: %w", o.Container, err)
	}
	out.Snapshot, out.SnapshotTook = taken.Snapshot.ID, time.Since(snapStart)
	// Ordering: the temporary snapshot goes last, once no clone is being
	// restored from it (made clones keep the files they map).
	defer func() {
		if _, derr := st.DropOp(context.WithoutCancel(ctx), op); derr != nil {
			out.Warnings = append(out.Warnings, fmt.Sprintf("delete the fork's temporary snapshot %s: %v (the store's next start deletes it)", taken.Snapshot.ID, derr))
		}
		out.Took = time.Since(start)
	}()
	// Ordering: each clone is made marked pending (a crash from here on
	// leaves clones CollectAbandoned finds) and loses the mark once the
	// fork keeps it, below.
	labels := map[string]string{LabelFork: op, LabelForkedFrom: o.Container, LabelForkPending: pending}
	defer func() {
		for i := range out.Clones {
			c := &out.Clones[i]
			if c.Err != nil || c.Removed {
				continue
			}
			if ferr := fin.DropLabel(context.WithoutCancel(ctx), c.ID, LabelForkPending); ferr != nil {
				out.Warnings = append(out.Warnings, fmt.Sprintf("clone %s: drop its %s label: %v (a later collection would take it for a crashed fork's: remove the label with `ctr containers label %s %s=`)",
					c.ID, LabelForkPending, ferr, c.ID, LabelForkPending))
			}
		}
	}()
	failed := false
	for i := 1; i <= o.N; i++ {
		id := fmt.Sprintf("%s-%d", o.Prefix, i)
		if ctx.Err() != nil {
			out.Clones = append(out.Clones, CloneResult{ID: id, Err: ctx.Err()})
			failed = true
			continue
		}
		cstart := time.Now()
		pid, err := m.Make(ctx, id, rec, taken.Snapshot.Dir, labels)
		out.Clones = append(out.Clones, CloneResult{ID: id, Pid: pid, Took: time.Since(cstart), Err: err})
		if err != nil {
			failed = true
			if o.AllOrNothing {
				break
			}
		}
	}
	if !failed {
		return out, nil
	}
	if !o.AllOrNothing {
		return out, fmt.Errorf("fork of %s: %d of %d clones failed", o.Container, out.Failed(), o.N)
	}
	for i := range out.Clones {
		c := &out.Clones[i]
		if c.Err != nil {
			continue
		}
		if rerr := m.Remove(context.WithoutCancel(ctx), c.ID); rerr != nil {
			out.Warnings = append(out.Warnings, fmt.Sprintf("all-or-nothing: remove clone %s: %v (remove it by hand: ctr task rm -f %s; ctr containers rm %s)", c.ID, rerr, c.ID, c.ID))
			continue
		}
		c.Removed = true
	}
	var first error
	for _, c := range out.Clones {
		if c.Err != nil {
			first = c.Err
			break
		}
	}
	return out, fmt.Errorf("fork of %s (all or nothing): a clone failed, the clones made were removed: %w", o.Container, first)
}

func newOp() (string, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("fork id: %w", err)
	}
	return "fork-" + hex.EncodeToString(b[:]), nil
}
