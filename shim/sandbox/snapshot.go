package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/hypervisor/control"
)

// SnapshotOptions say what Snapshot writes.
type SnapshotOptions struct {
	// Dir is where the VMM writes the VM snapshot: absolute, not existing yet.
	Dir string
	// Incremental writes only the memory pages dirtied since the VM's last
	// snapshot (Base), beside which Dir must be; the VMM refuses otherwise.
	Incremental bool
	// What names the operation for whoever is refused while it runs
	// (e.g. "snapshot into /var/lib/…/snapshots/5f0c…"); default "snapshot into Dir".
	What string
}

// SnapshotStats are one snapshot's figures.
type SnapshotStats struct {
	// VMM is cube-vmm's own account: freeze window, pre-copy, bytes written.
	VMM control.SnapshotResult
	// Sync is how long the guest took to sync its filesystems (0: a paused
	// guest, which is not asked).
	Sync time.Duration
	// Total is the whole snapshot as the shim saw it: sync, then the VMM's op.
	Total time.Duration
}

// runningOp is a whole-VM operation in progress (a snapshot; later a rollback).
type runningOp struct {
	what  string
	since time.Time
}

// beginOp claims the sandbox for one whole-VM operation. A second one is
// refused at once (errdefs unavailable, naming the one that runs), never
// queued: a queued request would hang behind a VMM that hangs.
func (s *Sandbox) beginOp(what string) (end func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if op := s.op; op != nil {
		return nil, fmt.Errorf("sandbox %s is busy: %s has been running since %s (%s); one snapshot or rollback at a time per sandbox: retry once it has finished: %w",
			s.o.ID, op.what, op.since.UTC().Format(time.RFC3339), time.Since(op.since).Round(time.Millisecond), errdefs.ErrUnavailable)
	}
	op := &runningOp{what: what, since: time.Now()}
	s.op = op
	return func() {
		s.mu.Lock()
		if s.op == op {
			s.op = nil
		}
		s.mu.Unlock()
	}, nil
}

// Busy names the whole-VM operation in progress ("" when none).
func (s *Sandbox) Busy() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.op == nil {
		return ""
	}
	return s.op.what
}

// Base is the directory of the VM's last snapshot, the parent of its next
// incremental one ("" when there is none, or when the last snapshot failed:
// the VMM then forgets its parent too).
func (s *Sandbox) Base() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.base
}

// Snapshot writes a whole-VM snapshot into o.Dir (see VMM.Snapshot). A
// running guest syncs its filesystems first, so that the disk copies in the
// snapshot are consistent on their own; a paused guest cannot answer and
// needs not: Pause froze its filesystems, so its disks are clean, and the
// snapshot holds them frozen: whatever restores it thaws them through the
// agent (templates are snapshots of running guests and need no thaw).
//
// One snapshot at a time per sandbox: while one runs, another is refused at
// once with errdefs.ErrUnavailable naming it.
func (s *Sandbox) Snapshot(ctx context.Context, o SnapshotOptions) (SnapshotStats, error) {
	if o.Dir == "" {
		return SnapshotStats{}, fmt.Errorf("sandbox %s: snapshot: no directory: %w", s.o.ID, errdefs.ErrInvalidArgument)
	}
	if o.What == "" {
		o.What = "snapshot into " + o.Dir
	}
	if err := s.refuseBlockVolumes(); err != nil {
		return SnapshotStats{}, err
	}
	end, err := s.beginOp(o.What)
	if err != nil {
		return SnapshotStats{}, err
	}
	defer end()
	start := time.Now()
	var st SnapshotStats
	if st.Sync, err = s.syncForSnapshot(ctx); err != nil {
		return SnapshotStats{}, err
	}
	// The shares as the guest knows them now: cube-vmm saves its FUSE
	// session below them, a restore re-binds them (sharerec.go).
	shares := s.shareRecords()
	res, err := s.o.VMM.Snapshot(ctx, o.Dir, o.Incremental)
	if err == nil {
		err = writeShares(o.Dir, shares)
	}
	s.mu.Lock()
	if err != nil {
		s.base = ""
	} else {
		s.base = o.Dir
	}
	s.mu.Unlock()
	if err != nil {
		var refused *control.RefusedError
		if errors.As(err, &refused) {
			err = fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
		}
		return SnapshotStats{}, fmt.Errorf("sandbox %s: %w", s.o.ID, err)
	}
	st.VMM, st.Total = res, time.Since(start)
	return st, nil
}

// syncForSnapshot syncs a running guest's filesystems; a paused one needs
// not (see Snapshot). Any other state is refused.
func (s *Sandbox) syncForSnapshot(ctx context.Context) (time.Duration, error) {
	s.mu.Lock()
	st, agent := s.state, s.agent
	s.mu.Unlock()
	switch st {
	case StateRunning:
		if agent == nil {
			return 0, nil
		}
		start := time.Now()
		if err := agent.SyncFilesystems(ctx); err != nil {
			return 0, fmt.Errorf("sandbox %s: snapshot: sync guest filesystems: %w", s.o.ID, err)
		}
		return time.Since(start), nil
	case StatePaused:
		return 0, nil
	default:
		return 0, fmt.Errorf("sandbox %s: snapshot in state %s: %w", s.o.ID, st, errdefs.ErrFailedPrecondition)
	}
}
