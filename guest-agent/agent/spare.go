package agent

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/cube-runtime/cube/guest-agent/container"
	"github.com/cube-runtime/cube/guest-agent/initsys"
	"github.com/cube-runtime/cube/guest-agent/protocol"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// PrepareSpare parks a container helper for the next create
// (container.Spare): a template VM is snapshotted with one, so the first
// container of each sandbox restored from it skips the helper's fork,
// start and new network namespace.
func (s *Service) PrepareSpare(ctx context.Context, req *protocol.PrepareSpareRequest) (*protocol.PrepareSpareResponse, error) {
	nss := container.DefaultSpareNamespaces
	if len(req.Namespaces) > 0 {
		nss = nil
		for _, n := range req.Namespaces {
			nss = append(nss, specs.LinuxNamespaceType(n))
		}
	}
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	if s.spare != nil {
		return &protocol.PrepareSpareResponse{Pid: uint32(s.spare.Pid)}, nil
	}
	// The agent decodes the first create's spec too: warm its caches as
	// the spare warms its own; and it mounts the first container's disk.
	container.WarmJSON()
	s.warmDisks()
	sp, err := container.PrepareSpare(s.cfg.HelperPath, nss, container.Starter[initsys.Exit](s.cfg.Reaper.Start))
	if err != nil {
		return nil, toStatus(err, "prepare a spare container helper")
	}
	s.spare = sp
	s.log.WithFields(logrus.Fields{"pid": sp.Pid, "ms": sp.Timing}).Debug("spare container helper parked")
	return &protocol.PrepareSpareResponse{Pid: uint32(sp.Pid), Timing: sp.Timing}, nil
}

// takeSpare returns the parked spare if it fits o, and discards one that
// does not (it would only hold memory). Nil without a fitting spare.
func (s *Service) takeSpare(o container.SpawnOptions) *container.Spare[initsys.Exit] {
	if o.Mode != container.ModeCreate {
		return nil
	}
	s.spareMu.Lock()
	sp := s.spare
	s.spare = nil
	s.spareMu.Unlock()
	if sp == nil {
		return nil
	}
	if !sp.Fits(o) {
		s.log.WithField("pid", sp.Pid).Debug("spare container helper does not fit the container's namespaces: discarded")
		sp.Discard()
		return nil
	}
	return sp
}

// prepareHelper prepares c's process o: a create takes the spare when it
// fits, anything else forks a helper.
func (s *Service) prepareHelper(c *containerEntry, o container.SpawnOptions) (*container.Prepared[initsys.Exit], error) {
	starter := container.Starter[initsys.Exit](s.cfg.Reaper.Start)
	sp := s.takeSpare(o)
	if sp == nil {
		return container.Prepare(o, starter)
	}
	if c.cgroup != nil {
		// Ordering: in the container's cgroup before it runs anything of
		// the container's (a forked helper is cloned into it).
		if err := joinCgroup(c.cgroup.fd, sp.Pid); err != nil {
			sp.Discard()
			return nil, err
		}
	}
	prep, err := sp.Take(o)
	if errors.Is(err, container.ErrSpareGone) {
		s.log.WithError(err).Warn("spare container helper died; forking one")
		return container.Prepare(o, starter)
	}
	return prep, err
}

// joinCgroup moves pid into the cgroup2 directory dirFD.
func joinCgroup(dirFD, pid int) error {
	fd, err := unix.Openat(dirFD, "cgroup.procs", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open cgroup.procs: %w", err)
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte(strconv.Itoa(pid))); err != nil {
		return fmt.Errorf("move the spare container helper %d into the container's cgroup: %w", pid, err)
	}
	return nil
}
