package agent

import (
	"context"
	"sort"

	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/guest-agent/protocol"
)

// ListProcesses implements protocol.AgentService: every process the agent
// holds (until Delete), ordered by container id, the init first, then execs
// by id. After a rollback these are the snapshot's processes, and the host
// reconciles its own view with them.
func (s *Service) ListProcesses(ctx context.Context, req *protocol.ListProcessesRequest) (*protocol.ListProcessesResponse, error) {
	if req.ContainerId != "" {
		if err := protocol.ValidateID("container", req.ContainerId); err != nil {
			return nil, errInvalid("%v", err)
		}
	}
	s.mu.Lock()
	var procs []*process
	ids := make([]string, 0, len(s.containers))
	for id := range s.containers {
		if req.ContainerId == "" || id == req.ContainerId {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	for _, id := range ids {
		c := s.containers[id]
		if c.init != nil {
			procs = append(procs, c.init)
		}
		execs := make([]string, 0, len(c.execs))
		for e := range c.execs {
			execs = append(execs, e)
		}
		sort.Strings(execs)
		for _, e := range execs {
			procs = append(procs, c.execs[e])
		}
	}
	s.mu.Unlock()
	if req.ContainerId != "" && len(ids) == 0 {
		return nil, errNotFound("container %q not found", req.ContainerId)
	}
	r := &protocol.ListProcessesResponse{}
	for _, p := range procs {
		r.Processes = append(r.Processes, p.info())
	}
	return r, nil
}

func (p *process) info() *protocol.ProcessInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	return &protocol.ProcessInfo{
		ContainerId: p.containerID, ExecId: p.execID, Pid: uint32(p.pid), Status: p.state.String(),
		ExitStatus: p.exit.Code(), ExitedAtUnixNano: exitTime(p.exit),
		Stdio:    &protocol.Stdio{Stdin: p.wanted[protocol.Stdin], Stdout: p.wanted[protocol.Stdout], Stderr: p.wanted[protocol.Stderr]},
		Terminal: p.terminal,
	}
}

// RenameContainer implements protocol.AgentService: the container and each
// of its processes answer to new_id from now on (its cgroup keeps its
// directory). The host calls it after restoring a checkpoint under another
// containerd id; the guest's processes go on untouched.
func (s *Service) RenameContainer(ctx context.Context, req *protocol.RenameContainerRequest) (*protocol.Empty, error) {
	if err := protocol.ValidateID("container", req.ContainerId); err != nil {
		return nil, errInvalid("%v", err)
	}
	if err := protocol.ValidateID("new container", req.NewId); err != nil {
		return nil, errInvalid("%v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.containers[req.ContainerId]
	if !ok {
		return nil, errNotFound("container %q not found", req.ContainerId)
	}
	if req.NewId == req.ContainerId {
		return &protocol.Empty{}, nil
	}
	if _, taken := s.containers[req.NewId]; taken {
		return nil, toStatus(errAlreadyExists(req.NewId), "rename %q", req.ContainerId)
	}
	delete(s.containers, req.ContainerId)
	c.id = req.NewId
	s.containers[c.id] = c
	procs := make([]*process, 0, len(c.execs)+1)
	if c.init != nil {
		procs = append(procs, c.init)
	}
	for _, p := range c.execs {
		procs = append(procs, p)
	}
	for _, p := range procs {
		p.mu.Lock()
		p.containerID = req.NewId
		p.mu.Unlock()
	}
	s.log.WithFields(logrus.Fields{"container": req.ContainerId, "new_id": req.NewId}).Info("renamed")
	return &protocol.Empty{}, nil
}
