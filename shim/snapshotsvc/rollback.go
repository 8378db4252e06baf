package snapshotsvc

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/shim/sandbox"
	api "github.com/cube-runtime/cube/shim/snapshotapi"
)

// Processes is what Rollback, ListProcesses and Signal need of the task
// service (*task.Service) besides the VM: its processes. A Sandboxes that
// is not also a Processes answers these RPCs with Unimplemented.
type Processes interface {
	// RollbackSandbox rolls the VM of containerID back to dir and
	// reconciles the shim's processes with the guest's.
	RollbackSandbox(ctx context.Context, containerID, dir, what string) (sandbox.RollbackStats, error)
	// GuestProcesses lists the guest's processes, Known set for those
	// containerd knows.
	GuestProcesses(ctx context.Context, containerID string) ([]sandbox.GuestProcess, error)
	// SignalGuest signals a guest process, also one containerd forgot.
	SignalGuest(ctx context.Context, containerID, execID string, sig uint32, all bool) error
}

func (s *Service) processes(op string) (Processes, error) {
	p, ok := s.o.Sandboxes.(Processes)
	if !ok {
		return nil, fmt.Errorf("%s: this shim's task service cannot reconcile processes: %w", op, errdefs.ErrNotImplemented)
	}
	return p, nil
}

// Rollback implements api.SnapshotsService.
func (s *Service) Rollback(ctx context.Context, req *api.RollbackRequest) (*api.RollbackResponse, error) {
	if err := checkRollbackRequest(req); err != nil {
		return nil, errOut(err)
	}
	procs, err := s.processes("rollback of " + req.ContainerId)
	if err != nil {
		return nil, errOut(err)
	}
	sb, err := s.sandboxOf("rollback", req.ContainerId)
	if err != nil {
		return nil, errOut(err)
	}
	what := "rollback of container " + req.ContainerId + " to " + req.Dir
	if req.Id != "" {
		what = "rollback of container " + req.ContainerId + " to snapshot " + req.Id + " (" + req.Dir + ")"
	}
	st, err := procs.RollbackSandbox(ctx, req.ContainerId, req.Dir, what)
	if err != nil {
		return nil, errOut(fmt.Errorf("rollback of %s: %w", req.ContainerId, err))
	}
	resp := &api.RollbackResponse{SandboxId: sb.ID(), Dir: req.Dir, Id: req.Id, VmmPid: uint32(sb.Pid()),
		Timings: &api.RollbackTimings{VmmPrepareMs: st.VMM.PrepareMS, VmmFrozenMs: st.VMM.FrozenMS, VmmTotalMs: st.VMM.TotalMS,
			ReconnectMs: ms(st.Reconnect), ReconcileMs: ms(st.Reconcile), ShimTotalMs: ms(st.Total)},
		Memory: st.VMM.Memory, PagesRewritten: st.VMM.Pages, Warnings: st.Warnings}
	for _, c := range st.Processes {
		resp.Processes = append(resp.Processes, &api.ProcessChange{ContainerId: c.ContainerID, ExecId: c.ExecID, Pid: c.Pid,
			Action: c.Action, Status: c.Status})
	}
	s.o.Log.WithFields(logrus.Fields{"sandbox": sb.ID(), "container": req.ContainerId, "id": req.Id, "dir": req.Dir,
		"memory": st.VMM.Memory, "pages_rewritten": st.VMM.Pages, "vmm_frozen_ms": st.VMM.FrozenMS,
		"shim_total_ms": ms(st.Total), "processes": len(st.Processes)}).Info("rolled back")
	return resp, nil
}

// ListProcesses implements api.SnapshotsService.
func (s *Service) ListProcesses(ctx context.Context, req *api.ListProcessesRequest) (*api.ListProcessesResponse, error) {
	procs, err := s.processes("list processes")
	if err != nil {
		return nil, errOut(err)
	}
	sb, err := s.sandboxOf("list processes", req.ContainerId)
	if err != nil {
		return nil, errOut(err)
	}
	list, err := procs.GuestProcesses(ctx, req.ContainerId)
	if err != nil {
		return nil, errOut(fmt.Errorf("list processes of %s: %w", req.ContainerId, err))
	}
	resp := &api.ListProcessesResponse{SandboxId: sb.ID()}
	for _, g := range list {
		gp := &api.GuestProcess{ContainerId: g.ContainerID, ExecId: g.ExecID, Pid: g.Pid, Status: g.Status, Known: g.Known}
		if g.Status == sandbox.GuestStopped {
			gp.ExitStatus = g.Exit.Status
			if !g.Exit.ExitedAt.IsZero() {
				gp.ExitedAtUnixNano = g.Exit.ExitedAt.UnixNano()
			}
		}
		resp.Processes = append(resp.Processes, gp)
	}
	return resp, nil
}

// Signal implements api.SnapshotsService.
func (s *Service) Signal(ctx context.Context, req *api.SignalRequest) (*api.SignalResponse, error) {
	if req.Signal == 0 || req.Signal > 64 {
		return nil, errOut(fmt.Errorf("signal %d to %s: want a signal number 1..64: %w", req.Signal, req.ContainerId, errdefs.ErrInvalidArgument))
	}
	if req.All && req.ExecId != "" {
		return nil, errOut(fmt.Errorf("signal to %s: all signals every process of the container: give no exec id with it: %w", req.ContainerId, errdefs.ErrInvalidArgument))
	}
	procs, err := s.processes("signal")
	if err != nil {
		return nil, errOut(err)
	}
	if _, err := s.sandboxOf("signal", req.ContainerId); err != nil {
		return nil, errOut(err)
	}
	if err := procs.SignalGuest(ctx, req.ContainerId, req.ExecId, req.Signal, req.All); err != nil {
		return nil, errOut(err)
	}
	return &api.SignalResponse{}, nil
}

func checkRollbackRequest(req *api.RollbackRequest) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("rollback of %.64q: %s: %w", req.ContainerId, fmt.Sprintf(format, a...), errdefs.ErrInvalidArgument)
	}
	switch {
	case req.ContainerId == "":
		return bad("no container id")
	case req.Dir == "" || !filepath.IsAbs(req.Dir) || filepath.Clean(req.Dir) != req.Dir || len(req.Dir) > maxPath:
		return bad("dir %q must be the absolute, clean directory of a VM snapshot", req.Dir)
	case strings.ContainsAny(req.Dir, "\n\x00"):
		return bad("dir %q holds a newline or NUL", req.Dir)
	case len(req.Id) > api.MaxRefLength:
		return bad("id of %d bytes, at most %d", len(req.Id), api.MaxRefLength)
	}
	return nil
}
