package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/hypervisor/control"
)

// RollbackOptions say what Rollback does around the VMM's op. The hooks are
// the task service's: the sandbox knows the VM and the agent connection, the
// task service the processes.
type RollbackOptions struct {
	// Dir is the VM snapshot to roll back to: absolute and clean.
	Dir string
	// What names the operation for whoever is refused while it runs;
	// default "rollback to Dir".
	What string
	// Prepare runs once the sandbox is claimed, before the VMM's op: the
	// task service holds its processes' waits and stdio (their connections
	// are about to be reset) without dropping anything.
	Prepare func()
	// Abort runs when the VMM's op failed: the VM is as it was, and so must
	// be what Prepare held.
	Abort func()
	// Reconcile runs once the VM rolled back and its agent answers on a new
	// connection, still inside the one-operation guard: the task service
	// matches its processes with the guest's. Its error is the rollback's
	// (the VM stays rolled back: there is nothing to undo it with).
	Reconcile func(ctx context.Context, agent AgentClient) ([]ProcessChange, error)
}

// ProcessChange is what a rollback's reconciliation did with one process
// (the task service's account; see the Action constants).
type ProcessChange struct {
	ContainerID, ExecID string
	// Pid is the guest pid (0 when the guest has no such process).
	Pid    uint32
	Action string
	// Status is the guest's after the rollback (GuestCreated, …; "" when none).
	Status string
}

// Reconciliation actions (ProcessChange.Action).
const (
	// ActionEnded: containerd knew the process, the snapshot did not: it
	// ended with 137 and an exit event.
	ActionEnded = "ended"
	// ActionRevived: it had exited after the snapshot and runs again.
	ActionRevived = "revived"
	// ActionReattached: it ran before and after: streams and wait renewed.
	ActionReattached = "reattached"
	// ActionUnchanged: stopped before and after (or created before and after).
	ActionUnchanged = "unchanged"
	// ActionUnknown: the guest runs it, containerd had deleted it.
	ActionUnknown = "unknown"
)

// RollbackStats are one rollback's figures.
type RollbackStats struct {
	// VMM is cube-vmm's own account: prepare, freeze window, memory mode.
	VMM control.RollbackResult
	// Reconnect: dialing the agent again, thaw, clock, RNG.
	Reconnect time.Duration
	// Reconcile: the task service's reconciliation.
	Reconcile time.Duration
	// Total is the whole rollback as the shim saw it.
	Total time.Duration
	// Warnings are steps after the VMM's op that failed without undoing it.
	Warnings []string
	// Processes is what the reconciliation did.
	Processes []ProcessChange
}

// Rollback rolls the VM back in place to the snapshot in o.Dir: same VMM
// process, same sockets, same sandbox. Every vsock connection was reset by
// the VMM (the transport reset), so the agent is dialed again and replaces
// the old connection; then the guest's filesystems are thawed (a snapshot of
// a paused VM holds them frozen), its clock stepped and its RNG reseeded, and
// o.Reconcile matches the host's view of the processes with the guest's.
//
// One whole-VM operation at a time: while a snapshot or a rollback runs,
// another is refused at once with errdefs.ErrUnavailable naming it. A
// rollback the VMM refuses or fails leaves the sandbox as it was.
func (s *Sandbox) Rollback(ctx context.Context, o RollbackOptions) (RollbackStats, error) {
	if o.Dir == "" || !filepath.IsAbs(o.Dir) || filepath.Clean(o.Dir) != o.Dir {
		return RollbackStats{}, fmt.Errorf("sandbox %s: rollback to %q: want the absolute, clean directory of a VM snapshot: %w", s.o.ID, o.Dir, errdefs.ErrInvalidArgument)
	}
	if o.What == "" {
		o.What = "rollback to " + o.Dir
	}
	if err := s.refuseBlockVolumes(); err != nil {
		return RollbackStats{}, err
	}
	end, err := s.beginOp(o.What)
	if err != nil {
		return RollbackStats{}, err
	}
	defer end()
	start := time.Now()
	s.mu.Lock()
	st, old := s.state, s.agent
	s.mu.Unlock()
	if st != StateRunning || old == nil {
		return RollbackStats{}, fmt.Errorf("sandbox %s: rollback in state %s: only a running VM rolls back (resume a paused one first): %w", s.o.ID, st, errdefs.ErrFailedPrecondition)
	}
	if o.Prepare != nil {
		o.Prepare()
	}
	// Ordering: the old agent connection and everything on it stay until the
	// VMM's op has succeeded; a failed rollback changed nothing, so the
	// sandbox must go on exactly as before (Abort gives back what Prepare held).
	res, err := s.o.VMM.Rollback(ctx, o.Dir)
	if err != nil {
		if o.Abort != nil {
			o.Abort()
		}
		var refused *control.RefusedError
		if errors.As(err, &refused) {
			err = fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
		}
		return RollbackStats{}, fmt.Errorf("sandbox %s: rollback to %s (the VM goes on as it was): %w", s.o.ID, o.Dir, err)
	}
	stats := RollbackStats{VMM: res}
	s.mu.Lock()
	// The VM's parent is now the snapshot it rolled back to (cube-vmm's
	// too): the base of its next incremental snapshot.
	s.base = o.Dir
	s.mu.Unlock()

	recon := time.Now()
	agent, err := s.reconnect(ctx, old)
	if err != nil {
		return stats, fmt.Errorf("sandbox %s: rolled back to %s, but %w", s.o.ID, o.Dir, err)
	}
	stats.Warnings = s.freshenRolledBack(ctx, agent)
	stats.Reconnect = time.Since(recon)
	if o.Reconcile != nil {
		rstart := time.Now()
		stats.Processes, err = o.Reconcile(ctx, agent)
		stats.Reconcile = time.Since(rstart)
		if err != nil {
			return stats, fmt.Errorf("sandbox %s: rolled back to %s, but reconciling the shim's processes with the guest's failed: %w", s.o.ID, o.Dir, err)
		}
	}
	stats.Total = time.Since(start)
	return stats, nil
}

// reconnect dials the agent again after a rollback and makes the new
// connection the sandbox's; the old one (reset by the transport reset) is
// closed, which ends whatever still waited on it.
func (s *Sandbox) reconnect(ctx context.Context, old AgentClient) (AgentClient, error) {
	dctx, cancel := context.WithTimeout(ctx, s.o.BootTimeout)
	defer cancel()
	agent, err := s.dialAgent(dctx, true)
	if err != nil {
		return nil, fmt.Errorf("its guest agent does not answer on a new connection: %w: %w (console log: %s)",
			err, errdefs.ErrUnavailable, filepath.Join(s.o.Dir, "console.log"))
	}
	s.mu.Lock()
	s.agent = agent
	s.frozen = false
	s.mu.Unlock()
	if old != agent {
		old.Close()
	}
	return agent, nil
}

// freshenRolledBack thaws the guest's filesystems, steps its clock and
// reseeds its RNG (see freshenRestoredGuest); what fails is logged and
// returned as a warning: the VM has rolled back and runs, and none of these
// can undo that.
func (s *Sandbox) freshenRolledBack(ctx context.Context, agent AgentClient) []string {
	var warnings []string
	if err := agent.ThawFilesystems(ctx); err != nil {
		warnings = append(warnings, fmt.Sprintf("thaw guest filesystems: %v (writes in the guest block until they thaw)", err))
	}
	if err := freshenRestoredGuest(ctx, agent, s.o.Log); err != nil {
		warnings = append(warnings, err.Error())
	}
	for _, w := range warnings {
		s.o.Log.WithField("after", "rollback").Warn(w)
	}
	return warnings
}
