package task

import (
	"context"
	"fmt"
	"os"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/core/runtime"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cube-runtime/cube/shim/process"
	"github.com/cube-runtime/cube/shim/sandbox"
)

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func statusOf(st process.Status) task.Status {
	switch st {
	case process.Created:
		return task.Status_CREATED
	case process.Running:
		return task.Status_RUNNING
	case process.Paused:
		return task.Status_PAUSED
	case process.Stopped:
		return task.Status_STOPPED
	}
	return task.Status_UNKNOWN
}

// Start implements taskAPI: run a created init or exec.
func (s *Service) Start(ctx context.Context, req *taskAPI.StartRequest) (*taskAPI.StartResponse, error) {
	_, p, err := s.getProcess(req.ID, req.ExecID)
	if err != nil {
		return nil, errOut(err)
	}
	// Held until the start event is out, so that a process exiting at once
	// has its exit event published after its start event.
	s.lifecycleMu.Lock()
	defer s.lifecycleMu.Unlock()
	start := time.Now()
	if err := p.Start(ctx); err != nil {
		return nil, errOut(err)
	}
	pid := s.hostPid()
	f := logrus.Fields{"container": req.ID, "exec": req.ExecID, "took_ms": sandbox.MS(time.Since(start))}
	if t := p.StartTiming(); t != "" {
		f["guest_ms"] = t
	}
	s.o.Log.WithFields(f).Info("process started")
	if req.ExecID == "" {
		s.publish(ctx, runtime.TaskStartEventTopic, &eventstypes.TaskStart{ContainerID: req.ID, Pid: pid})
	} else {
		s.publish(ctx, runtime.TaskExecStartedEventTopic, &eventstypes.TaskExecStarted{ContainerID: req.ID, ExecID: req.ExecID, Pid: pid})
	}
	return &taskAPI.StartResponse{Pid: pid}, nil
}

// onlyContainer reports whether id is the shim's one container.
func (s *Service) onlyContainer(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.containers[id]
	return ok && len(s.containers) == 1 && s.sb != nil
}

// stopSandbox powers the VM off with the sandbox's last container, rather
// than at Shutdown, so Delete returning means every resource is released.
func (s *Service) stopSandbox(ctx context.Context) {
	s.mu.Lock()
	sb := s.sb
	s.mu.Unlock()
	if sb == nil {
		return
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	_ = sb.Stop(stopCtx)
	cancel()
}

// Delete implements taskAPI: release an exited (or never started) process;
// for the init, also the container's rootfs disk, and the VM with the last
// container.
func (s *Service) Delete(ctx context.Context, req *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	c, p, err := s.getProcess(req.ID, req.ExecID)
	if err != nil {
		return nil, errOut(err)
	}
	steps := sandbox.NewSteps(time.Now())
	// The sandbox's last container with its init already stopped: the VM
	// goes first (its filesystems synced, then powered off). Deleting the
	// process in the guest would only be undone by the power-off, so the
	// process's Delete then skips the guest (its VM is gone).
	stopFirst := req.ExecID == "" && p.Status() == process.Stopped && s.onlyContainer(req.ID)
	if stopFirst {
		s.stopSandbox(ctx)
		steps.Mark("stop")
	}
	exit, err := p.Delete(ctx)
	if err != nil {
		return nil, errOut(err)
	}
	steps.Mark("process")
	pid := s.hostPid()
	resp := &taskAPI.DeleteResponse{Pid: pid, ExitStatus: exit.Status, ExitedAt: timestamp(exit.At)}
	if req.ExecID != "" {
		s.mu.Lock()
		delete(c.execs, req.ExecID)
		s.mu.Unlock()
		return resp, nil
	}
	// The init is gone: so are its execs (the container's pid namespace died).
	s.mu.Lock()
	execs := c.execs
	c.execs = map[string]*execProc{}
	sb := s.sb
	s.mu.Unlock()
	for _, e := range execs {
		if e != nil {
			_, _ = e.p.Delete(ctx)
		}
	}
	s.mu.Lock()
	delete(s.containers, req.ID)
	last := len(s.containers) == 0
	s.mu.Unlock()
	s.releaseVolumes(c, c.volumes)
	if last {
		s.closeVolumes()
	}
	// Ordering: the container's processes are gone (above), so nothing in
	// the guest uses its raw block volumes: their slots and claims go back
	// (for the last container too, before the VM stops: Stop would also).
	if sb != nil {
		if err := sb.DetachBlockVolumes(ctx, req.ID); err != nil {
			s.o.Log.WithError(err).WithField("container", req.ID).Warn("detach raw block volumes")
		}
	}
	// The last container's disk goes with the VM (Stop syncs the guest's
	// filesystems first); others give their drive slot back now.
	if sb != nil && !last {
		if err := sb.DetachRootfs(ctx, req.ID); err != nil {
			s.o.Log.WithError(err).WithField("container", req.ID).Warn("detach rootfs")
		}
	}
	if last && sb != nil && !stopFirst {
		s.stopSandbox(ctx)
		steps.Mark("stop")
	}
	removeRecord(c.bundle)
	s.publish(ctx, runtime.TaskDeleteEventTopic, &eventstypes.TaskDelete{
		ContainerID: req.ID, ID: req.ID, Pid: pid, ExitStatus: exit.Status, ExitedAt: timestamp(exit.At),
	})
	steps.Mark("event")
	s.o.Log.WithFields(logrus.Fields{"container": req.ID, "last": last, "total_ms": sandbox.MS(steps.Total()),
		"steps_ms": steps.String()}).Info("container deleted")
	return resp, nil
}

// Exec implements taskAPI: prepare another process in a running container.
func (s *Service) Exec(ctx context.Context, req *taskAPI.ExecProcessRequest) (*emptypb.Empty, error) {
	if err := validateID("exec", req.ExecID); err != nil {
		return nil, errOut(err)
	}
	c, err := s.getContainer(req.ID)
	if err != nil {
		return nil, errOut(err)
	}
	if st := c.init.Status(); st != process.Running {
		return nil, errOut(fmt.Errorf("exec in container %s: it is %s: %w", req.ID, st, errdefs.ErrFailedPrecondition))
	}
	if req.Spec == nil || len(req.Spec.GetValue()) == 0 {
		return nil, errOut(fmt.Errorf("exec %s: no process spec: %w", req.ExecID, errdefs.ErrInvalidArgument))
	}
	raw := req.Spec.GetValue()
	if len(raw) > maxSpecSize {
		return nil, errOut(fmt.Errorf("exec %s: process spec larger than %d bytes: %w", req.ExecID, maxSpecSize, errdefs.ErrInvalidArgument))
	}
	s.mu.Lock()
	if _, ok := c.execs[req.ExecID]; ok {
		s.mu.Unlock()
		return nil, errOut(fmt.Errorf("exec %s: %w", req.ExecID, errdefs.ErrAlreadyExists))
	}
	c.execs[req.ExecID] = nil // reserved
	sb := s.sb
	s.mu.Unlock()
	uris := stdioURIs{stdin: req.Stdin, stdout: req.Stdout, stderr: req.Stderr, terminal: req.Terminal}
	p, err := s.newProcess(ctx, sb, req.ID, req.ExecID, uris, nil, func(ctx context.Context, flags sandbox.StdioFlags) (uint32, error) {
		return sb.Agent().ExecProcess(ctx, sandbox.ExecProcessRequest{ContainerID: req.ID, ExecID: req.ExecID, Process: raw, Stdio: flags})
	})
	s.mu.Lock()
	if err != nil {
		delete(c.execs, req.ExecID)
	} else {
		c.execs[req.ExecID] = &execProc{p: p, stdio: uris}
	}
	s.mu.Unlock()
	if err != nil {
		return nil, errOut(err)
	}
	s.publish(ctx, runtime.TaskExecAddedEventTopic, &eventstypes.TaskExecAdded{ContainerID: req.ID, ExecID: req.ExecID})
	return &emptypb.Empty{}, nil
}

// State implements taskAPI.
func (s *Service) State(ctx context.Context, req *taskAPI.StateRequest) (*taskAPI.StateResponse, error) {
	c, p, err := s.getProcess(req.ID, req.ExecID)
	if err != nil {
		return nil, errOut(err)
	}
	uris := c.stdio
	if req.ExecID != "" {
		s.mu.Lock()
		if e := c.execs[req.ExecID]; e != nil {
			uris = e.stdio
		}
		s.mu.Unlock()
	}
	e := p.ExitStatus()
	return &taskAPI.StateResponse{
		ID: p.ID(), Bundle: c.bundle, Pid: s.hostPid(), Status: statusOf(p.Status()),
		Stdin: uris.stdin, Stdout: uris.stdout, Stderr: uris.stderr, Terminal: uris.terminal,
		ExitStatus: e.Status, ExitedAt: timestamp(e.At), ExecID: req.ExecID,
	}, nil
}

// Pids implements taskAPI: the guest pids of the container's processes.
func (s *Service) Pids(ctx context.Context, req *taskAPI.PidsRequest) (*taskAPI.PidsResponse, error) {
	c, err := s.getContainer(req.ID)
	if err != nil {
		return nil, errOut(err)
	}
	sb, err := s.runningSandbox()
	if err != nil {
		return nil, errOut(err)
	}
	pids, err := sb.Agent().ListPids(ctx, c.id)
	if err != nil {
		return nil, errOut(fmt.Errorf("list pids of %s: %w", c.id, err))
	}
	resp := &taskAPI.PidsResponse{}
	for _, pid := range pids {
		resp.Processes = append(resp.Processes, &task.ProcessInfo{Pid: pid})
	}
	return resp, nil
}

func (s *Service) runningSandbox() (*sandbox.Sandbox, error) {
	s.mu.Lock()
	sb := s.sb
	s.mu.Unlock()
	if sb == nil {
		return nil, fmt.Errorf("no sandbox VM: %w", errdefs.ErrFailedPrecondition)
	}
	if st := sb.State(); st != sandbox.StateRunning {
		return nil, fmt.Errorf("sandbox VM is %s: %w", st, errdefs.ErrFailedPrecondition)
	}
	return sb, nil
}

// soleSandbox returns the VM of container id for an operation on the whole
// VM (op, and why it is whole-VM), refused while the VM runs other
// containers or has none. A CRI pod's pause container is not one of them: a
// pod with one app container pauses and checkpoints through that container
// (what CRI's CheckpointContainer does).
func (s *Service) soleSandbox(op, id, why string) (*sandbox.Sandbox, error) {
	s.mu.Lock()
	others := 0
	for cid, c := range s.containers {
		// The pod's pause container does not count: it runs nothing a
		// frozen VM would hold up.
		if cid != id && (c == nil || !c.podSandbox) {
			others++
		}
	}
	sb := s.sb
	s.mu.Unlock()
	if others > 0 {
		return nil, fmt.Errorf("%s %s: its VM runs %d other containers, and %s: %w", op, id, others, why, errdefs.ErrFailedPrecondition)
	}
	if sb == nil {
		return nil, fmt.Errorf("%s %s: no VM: %w", op, id, errdefs.ErrFailedPrecondition)
	}
	return sb, nil
}

// Pause implements taskAPI: the whole VM is frozen, so only a VM running a
// single container can be paused through one task.
func (s *Service) Pause(ctx context.Context, req *taskAPI.PauseRequest) (*emptypb.Empty, error) {
	c, err := s.getContainer(req.ID)
	if err != nil {
		return nil, errOut(err)
	}
	if st := c.init.Status(); st != process.Running {
		return nil, errOut(fmt.Errorf("pause %s: it is %s: %w", req.ID, st, errdefs.ErrFailedPrecondition))
	}
	sb, err := s.soleSandbox("pause", req.ID, "pausing freezes the whole VM")
	if err != nil {
		return nil, errOut(err)
	}
	if err := sb.Pause(ctx); err != nil {
		return nil, errOut(fmt.Errorf("%v: %w", err, errdefs.ErrFailedPrecondition))
	}
	if err := c.init.Pause(); err != nil {
		return nil, errOut(err)
	}
	s.publish(ctx, runtime.TaskPausedEventTopic, &eventstypes.TaskPaused{ContainerID: req.ID})
	return &emptypb.Empty{}, nil
}

// Resume implements taskAPI.
func (s *Service) Resume(ctx context.Context, req *taskAPI.ResumeRequest) (*emptypb.Empty, error) {
	c, err := s.getContainer(req.ID)
	if err != nil {
		return nil, errOut(err)
	}
	if st := c.init.Status(); st != process.Paused {
		return nil, errOut(fmt.Errorf("resume %s: it is %s: %w", req.ID, st, errdefs.ErrFailedPrecondition))
	}
	s.mu.Lock()
	sb := s.sb
	s.mu.Unlock()
	if err := sb.Resume(ctx); err != nil {
		return nil, errOut(fmt.Errorf("%v: %w", err, errdefs.ErrFailedPrecondition))
	}
	if err := c.init.Resume(); err != nil {
		return nil, errOut(err)
	}
	s.publish(ctx, runtime.TaskResumedEventTopic, &eventstypes.TaskResumed{ContainerID: req.ID})
	return &emptypb.Empty{}, nil
}

// Kill implements taskAPI.
func (s *Service) Kill(ctx context.Context, req *taskAPI.KillRequest) (*emptypb.Empty, error) {
	_, p, err := s.getProcess(req.ID, req.ExecID)
	if err != nil {
		return nil, errOut(err)
	}
	if err := p.Kill(ctx, req.Signal, req.All); err != nil {
		return nil, errOut(err)
	}
	return &emptypb.Empty{}, nil
}

// ResizePty implements taskAPI.
func (s *Service) ResizePty(ctx context.Context, req *taskAPI.ResizePtyRequest) (*emptypb.Empty, error) {
	_, p, err := s.getProcess(req.ID, req.ExecID)
	if err != nil {
		return nil, errOut(err)
	}
	if err := p.ResizePty(ctx, req.Width, req.Height); err != nil {
		return nil, errOut(err)
	}
	return &emptypb.Empty{}, nil
}

// CloseIO implements taskAPI.
func (s *Service) CloseIO(ctx context.Context, req *taskAPI.CloseIORequest) (*emptypb.Empty, error) {
	_, p, err := s.getProcess(req.ID, req.ExecID)
	if err != nil {
		return nil, errOut(err)
	}
	if req.Stdin {
		if err := p.CloseIO(ctx); err != nil {
			return nil, errOut(err)
		}
	}
	return &emptypb.Empty{}, nil
}

// Update implements taskAPI. Changing a VM's resources (memory hotplug,
// vCPUs) is not supported by the VMM yet.
func (s *Service) Update(ctx context.Context, req *taskAPI.UpdateTaskRequest) (*emptypb.Empty, error) {
	if _, err := s.getContainer(req.ID); err != nil {
		return nil, errOut(err)
	}
	return nil, errOut(fmt.Errorf("update of %s: resizing a sandbox VM (memory, vCPUs) is not supported yet: %w", req.ID, errdefs.ErrNotImplemented))
}

// Stats implements taskAPI: the host cgroup metrics of the sandbox's VMM
// (the whole VM: every container in it, plus the VMM's own overhead). Per
// container guest metrics need an agent RPC that does not exist yet.
func (s *Service) Stats(ctx context.Context, req *taskAPI.StatsRequest) (*taskAPI.StatsResponse, error) {
	if _, err := s.getContainer(req.ID); err != nil {
		return nil, errOut(err)
	}
	s.mu.Lock()
	sb := s.sb
	s.mu.Unlock()
	if sb == nil || sb.Cgroup() == "" {
		return nil, errOut(fmt.Errorf("stats of %s: the VMM was not placed in a cgroup (no cgroupsPath or cgroup_parent), and guest metrics are not collected yet: %w", req.ID, errdefs.ErrNotImplemented))
	}
	m, err := sandbox.CgroupMetrics(sb.Cgroup())
	if err != nil {
		return nil, errOut(fmt.Errorf("stats of %s: %w", req.ID, err))
	}
	a, err := typeurl.MarshalAnyToProto(m)
	if err != nil {
		return nil, errOut(fmt.Errorf("stats of %s: %w", req.ID, err))
	}
	return &taskAPI.StatsResponse{Stats: a}, nil
}

// Wait implements taskAPI: block until the process exited.
func (s *Service) Wait(ctx context.Context, req *taskAPI.WaitRequest) (*taskAPI.WaitResponse, error) {
	_, p, err := s.getProcess(req.ID, req.ExecID)
	if err != nil {
		return nil, errOut(err)
	}
	select {
	case <-p.Exited():
	case <-ctx.Done():
		return nil, errOut(ctx.Err())
	}
	e := p.ExitStatus()
	return &taskAPI.WaitResponse{ExitStatus: e.Status, ExitedAt: timestamp(e.At)}, nil
}

// Connect implements taskAPI: the task pid is the VMM's.
func (s *Service) Connect(ctx context.Context, req *taskAPI.ConnectRequest) (*taskAPI.ConnectResponse, error) {
	if _, err := s.getContainer(req.ID); err != nil {
		return nil, errOut(err)
	}
	return &taskAPI.ConnectResponse{ShimPid: uint32(os.Getpid()), TaskPid: s.hostPid()}, nil
}

// Shutdown implements taskAPI: the shim exits once it serves no container.
func (s *Service) Shutdown(ctx context.Context, req *taskAPI.ShutdownRequest) (*emptypb.Empty, error) {
	s.mu.Lock()
	n := len(s.containers)
	sb := s.sb
	s.mu.Unlock()
	if n > 0 {
		return &emptypb.Empty{}, nil
	}
	if sb != nil {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		_ = sb.Stop(stopCtx)
		cancel()
	}
	s.o.Log.Info("shutdown")
	if s.o.Shutdown != nil {
		s.o.Shutdown.Shutdown()
	}
	return &emptypb.Empty{}, nil
}
