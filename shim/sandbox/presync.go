package sandbox

import (
	"context"
	"time"

	"github.com/sirupsen/logrus"
)

// presyncTimeout bounds a pre-sync, like Stop's own sync.
const presyncTimeout = time.Second

// presync is a guest sync started ahead of Stop (PreSync).
type presync struct {
	done chan struct{} // closed when the sync answered (or failed)
	err  error         // valid once done is closed
}

// PreSync starts syncing the guest's filesystems now, in the background,
// for a Stop expected soon: the task service calls it when the init of
// the sandbox's only container exits, so the VM's power-off at that
// container's Delete need not wait for the sync (its dirty pages are
// already written back while containerd handles the exit). It is dropped
// if another container's rootfs is attached before Stop (AttachRootfs):
// that container writes after the sync. A no-op unless the VM runs.
func (s *Sandbox) PreSync() {
	s.mu.Lock()
	agent, st := s.agent, s.state
	if agent == nil || st != StateRunning || s.stopping {
		s.mu.Unlock()
		return
	}
	p := &presync{done: make(chan struct{})}
	s.presync = p
	s.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), presyncTimeout)
		defer cancel()
		t0 := time.Now()
		p.err = agent.SyncFilesystems(ctx)
		close(p.done)
		s.o.Log.WithError(p.err).WithField("took_ms", MS(time.Since(t0))).Debug("guest pre-synced")
	}()
}

// dropPreSync forgets a pre-sync: the guest may write after it. Holds s.mu.
func (s *Sandbox) dropPreSyncLocked() { s.presync = nil }

// syncBeforeStop makes the guest's filesystems durable before the VMM
// stops: a pre-sync still valid is waited for (within ctx and
// presyncTimeout) instead of syncing again. It reports what it did, for
// Stop's steps: "presync" or "sync".
func (s *Sandbox) syncBeforeStop(ctx context.Context, agent AgentClient) string {
	s.mu.Lock()
	p := s.presync
	s.presync = nil
	s.mu.Unlock()
	if p != nil {
		select {
		case <-p.done:
		case <-ctx.Done():
		case <-time.After(presyncTimeout):
		}
		select {
		case <-p.done:
			if p.err == nil {
				return "presync"
			}
			s.o.Log.WithError(p.err).Debug("guest pre-sync failed: syncing again")
		default:
		}
	}
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	// The reply may never come: the guest powers off underneath it.
	if err := agent.SyncFilesystems(pctx); err != nil {
		s.o.Log.WithFields(logrus.Fields{"sandbox": s.o.ID}).WithError(err).Debug("guest sync before stop")
	}
	cancel()
	return "sync"
}
