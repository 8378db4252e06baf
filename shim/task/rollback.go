package task

import (
	"context"
	"fmt"
	"io"
	"net"
	"sort"
	"time"

	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/shim/process"
	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/stdio"
)

// Rollback in place, as the task service sees it: the sandbox rolls the VM
// back and dials the agent again (shim/sandbox, rollback.go); the task
// service holds its processes through the VMM's op and then reconciles them
// with the guest's, which are now those of the snapshot (docs/shim.md,
// "Rollback"). The snapshot service (shim/snapshotsvc) calls it.

// reviveStdioTimeout bounds reopening a revived process's fifos.
const reviveStdioTimeout = 5 * time.Second

// knownProcess is a process containerd knows, as the rollback found it.
type knownProcess struct {
	cid, eid string
	p        *process.Process
	uris     stdioURIs
}

type procKey struct{ cid, eid string }

// RollbackSandbox rolls the VM that runs containerID back in place to the
// snapshot in dir and reconciles the shim's processes with the guest's.
func (s *Service) RollbackSandbox(ctx context.Context, containerID, dir, what string) (sandbox.RollbackStats, error) {
	sb, err := s.SandboxOf(containerID)
	if err != nil {
		return sandbox.RollbackStats{}, err
	}
	var procs []knownProcess
	defer func() {
		// The guest's copies of host volumes are the snapshot's now: push
		// the host's again (emptyDir, in the VM, rolls back with it).
		s.mu.Lock()
		syncer := s.volumes
		s.mu.Unlock()
		if syncer != nil {
			syncer.Resync()
		}
	}()
	return sb.Rollback(ctx, sandbox.RollbackOptions{Dir: dir, What: what,
		Prepare: func() {
			procs = s.knownProcesses()
			for _, k := range procs {
				k.p.Hold()
			}
		},
		Abort: func() {
			for _, k := range procs {
				k.p.Release()
			}
		},
		Reconcile: func(ctx context.Context, agent sandbox.AgentClient) ([]sandbox.ProcessChange, error) {
			return s.reconcile(ctx, agent, procs)
		},
	})
}

// knownProcesses lists every process containerd knows in this shim.
func (s *Service) knownProcesses() []knownProcess {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []knownProcess
	for id, c := range s.containers {
		if c == nil {
			continue
		}
		out = append(out, knownProcess{cid: id, p: c.init, uris: c.stdio})
		for eid, e := range c.execs {
			if e != nil {
				out = append(out, knownProcess{cid: id, eid: eid, p: e.p, uris: e.stdio})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].cid != out[j].cid {
			return out[i].cid < out[j].cid
		}
		return out[i].eid < out[j].eid
	})
	return out
}

// reconcile matches each process containerd knows with the guest's after a
// rollback (see the actions in shim/sandbox), then drains the output of the
// guest's processes containerd no longer knows.
func (s *Service) reconcile(ctx context.Context, agent sandbox.AgentClient, procs []knownProcess) ([]sandbox.ProcessChange, error) {
	guest, err := agent.ListProcesses(ctx)
	if err != nil {
		// Without the guest's list, each process waits again on the new
		// connection: one the guest lacks fails its Wait and ends as lost.
		for _, k := range procs {
			k.p.Rebind(agent, nil, nil, nil)
		}
		return nil, fmt.Errorf("list the guest's processes: %w", err)
	}
	byKey := map[procKey]sandbox.GuestProcess{}
	for _, g := range guest {
		byKey[procKey{g.ContainerID, g.ExecID}] = g
	}
	var changes []sandbox.ProcessChange
	for _, k := range procs {
		g, ok := byKey[procKey{k.cid, k.eid}]
		delete(byKey, procKey{k.cid, k.eid})
		ch := sandbox.ProcessChange{ContainerID: k.cid, ExecID: k.eid, Pid: g.Pid, Status: g.Status}
		ch.Action = s.reconcileOne(ctx, agent, k, g, ok)
		changes = append(changes, ch)
	}
	for _, g := range guest {
		if _, unknown := byKey[procKey{g.ContainerID, g.ExecID}]; !unknown {
			continue
		}
		changes = append(changes, sandbox.ProcessChange{ContainerID: g.ContainerID, ExecID: g.ExecID, Pid: g.Pid,
			Status: g.Status, Action: sandbox.ActionUnknown})
		if g.Status != sandbox.GuestStopped {
			s.drainUnknown(ctx, agent, g)
		}
	}
	for _, c := range changes {
		s.o.Log.WithFields(logrus.Fields{"container": c.ContainerID, "exec": c.ExecID, "pid": c.Pid,
			"guest_status": c.Status, "action": c.Action}).Info("rollback: process reconciled")
	}
	return changes, nil
}

// reconcileOne brings one known process in line with the guest's g (inGuest:
// the guest has it) and returns the action taken.
func (s *Service) reconcileOne(ctx context.Context, agent sandbox.AgentClient, k knownProcess, g sandbox.GuestProcess, inGuest bool) string {
	log := s.o.Log.WithFields(logrus.Fields{"container": k.cid, "exec": k.eid})
	st := k.p.Status()
	switch {
	case !inGuest:
		// The snapshot predates it: it ends as killed, with an exit event.
		k.p.EndRolledBack()
		return sandbox.ActionEnded
	case (st == process.Stopped || st == process.Deleted) && g.Status != sandbox.GuestStopped:
		hio := s.reviveStdio(ctx, k, log)
		if err := k.p.Revive(agent, g.Status, hio); err != nil {
			log.WithError(err).Warn("rollback: the guest runs the process again, but the shim cannot")
			if hio != nil {
				hio.Close()
			}
			k.p.Rebind(agent, nil, nil, nil)
			return sandbox.ActionUnchanged
		}
		if hio != nil {
			hio.Attach(s.reattachStreams(ctx, agent, g, log))
		} else {
			s.drainUnknown(ctx, agent, g)
		}
		return sandbox.ActionRevived
	case st == process.Stopped || st == process.Deleted:
		k.p.Rebind(agent, nil, nil, nil)
		return sandbox.ActionUnchanged
	default:
		// Alive in the shim; in the guest alive too, or stopped at the
		// snapshot (the re-issued Wait then reports that exit at once).
		var in stdio.HalfCloser
		var out, errw io.ReadCloser
		if g.Status != sandbox.GuestStopped {
			in, out, errw = s.reattachStreams(ctx, agent, g, log)
		}
		k.p.Rebind(agent, in, out, errw)
		return sandbox.ActionReattached
	}
}

// reviveStdio opens a revived process's host stdio again from its URIs (its
// old one ended with it); one that cannot be opened is logged and the
// process's output discarded.
func (s *Service) reviveStdio(ctx context.Context, k knownProcess, log *logrus.Entry) *stdio.IO {
	octx, cancel := context.WithTimeout(ctx, reviveStdioTimeout)
	defer cancel()
	cfg := stdio.Config{Stdin: k.uris.stdin, Stdout: k.uris.stdout, Stderr: k.uris.stderr, Terminal: k.uris.terminal}
	hio, err := stdio.Open(octx, k.cid, s.o.Namespace, cfg, log)
	if err == nil {
		return hio
	}
	log.WithError(err).Warn("rollback: the revived process's stdio cannot be opened again; its output is discarded")
	hio, _ = stdio.Open(ctx, k.cid, s.o.Namespace, stdio.Config{Terminal: k.uris.terminal}, log)
	return hio
}

// reattachStreams connects the guest process's streams again (the rollback
// reset their connections); a stream that fails is logged and left out.
func (s *Service) reattachStreams(ctx context.Context, agent sandbox.AgentClient, g sandbox.GuestProcess, log *logrus.Entry) (stdio.HalfCloser, io.ReadCloser, io.ReadCloser) {
	open := func(want bool, st sandbox.Stream) net.Conn {
		if !want {
			return nil
		}
		c, err := agent.ReattachStream(ctx, g.ContainerID, g.ExecID, st)
		if err != nil {
			log.WithError(err).Warnf("rollback: %s not re-attached", st)
			return nil
		}
		return c
	}
	var in stdio.HalfCloser
	var out, errw io.ReadCloser
	if c := open(g.Stdio.Stdin, sandbox.Stdin); c != nil {
		in = halfCloser(c)
	}
	if c := open(g.Stdio.Stdout, sandbox.Stdout); c != nil {
		out = c
	}
	if c := open(g.Stdio.Stderr && !g.Terminal, sandbox.Stderr); c != nil {
		errw = c
	}
	return in, out, errw
}

// drainUnknown reads (and discards) the output of a guest process
// containerd no longer knows, so that it does not block on a full pipe.
func (s *Service) drainUnknown(ctx context.Context, agent sandbox.AgentClient, g sandbox.GuestProcess) {
	log := s.o.Log.WithFields(logrus.Fields{"container": g.ContainerID, "exec": g.ExecID, "pid": g.Pid})
	log.Warn("rollback: the guest runs a process containerd deleted after the snapshot; list and signal it through the snapshot service (cube.snapshot.v1 ListProcesses and Signal)")
	s.drainOutput(ctx, agent, g, log)
}

// drainOutput re-attaches a guest process's output streams and discards
// what comes on them.
func (s *Service) drainOutput(ctx context.Context, agent sandbox.AgentClient, g sandbox.GuestProcess, log *logrus.Entry) {
	_, out, errw := s.reattachStreams(ctx, agent, sandbox.GuestProcess{ContainerID: g.ContainerID, ExecID: g.ExecID,
		Stdio: sandbox.StdioFlags{Stdout: g.Stdio.Stdout, Stderr: g.Stdio.Stderr}, Terminal: g.Terminal}, log)
	for _, c := range []io.ReadCloser{out, errw} {
		if c != nil {
			go func() {
				_, _ = io.Copy(io.Discard, c)
				c.Close()
			}()
		}
	}
}

// GuestProcesses lists the guest's processes of the VM that runs
// containerID, each marked whether containerd knows it.
func (s *Service) GuestProcesses(ctx context.Context, containerID string) ([]sandbox.GuestProcess, error) {
	sb, err := s.runningSandboxOf(containerID)
	if err != nil {
		return nil, err
	}
	procs, err := sb.Agent().ListProcesses(ctx)
	if err != nil {
		return nil, fmt.Errorf("list the guest's processes: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range procs {
		c := s.containers[procs[i].ContainerID]
		if c == nil {
			continue
		}
		if procs[i].ExecID == "" {
			procs[i].Known = true
		} else if e := c.execs[procs[i].ExecID]; e != nil {
			procs[i].Known = true
		}
	}
	return procs, nil
}

// SignalGuest signals a guest process of the VM that runs containerID
// (execID "": the init; all: every process of the container), also one
// containerd no longer knows.
func (s *Service) SignalGuest(ctx context.Context, containerID, execID string, sig uint32, all bool) error {
	if execID != "" {
		if err := validateID("exec", execID); err != nil {
			return err
		}
	}
	sb, err := s.runningSandboxOf(containerID)
	if err != nil {
		return err
	}
	if err := sb.Agent().Signal(ctx, containerID, execID, sig, all); err != nil {
		name := containerID
		if execID != "" {
			name = execID + " of " + containerID
		}
		return fmt.Errorf("signal %d to %s in the guest: %w", sig, name, err)
	}
	return nil
}

// runningSandboxOf is SandboxOf for a VM that must answer: running, not
// paused.
func (s *Service) runningSandboxOf(containerID string) (*sandbox.Sandbox, error) {
	sb, err := s.SandboxOf(containerID)
	if err != nil {
		return nil, err
	}
	if st := sb.State(); st != sandbox.StateRunning || sb.Agent() == nil {
		return nil, fmt.Errorf("container %s: its VM is %s: the guest agent answers only while it runs (resume it first): %w", containerID, st, errdefs.ErrFailedPrecondition)
	}
	return sb, nil
}
