package api

import (
	"context"
	"time"

	"github.com/containerd/errdefs"
)

// Reap handles the running sandboxes past their deadline once: a sandbox
// created with autoPause is paused (its timeout restarts when it is resumed
// or connected to), any other is killed and deleted. Paused sandboxes do not
// expire. The deadline is a label, so it keeps counting across restarts of
// cube-api.
func (s *Server) Reap(ctx context.Context) {
	cs, err := s.be.List(ctx)
	if err != nil {
		s.log.WithError(err).Warn("reaper: list sandboxes")
		return
	}
	now := s.now()
	for _, c := range cs {
		sb := sandboxOf(c)
		if sb.EndAt.IsZero() || now.Before(sb.EndAt) || sb.State == "paused" {
			continue
		}
		log := s.log.WithFields(map[string]any{"sandbox": sb.SandboxID, "deadline": sb.EndAt})
		if sb.State == StatusUnknown {
			log.Warn("reaper: sandbox past its timeout, but its state is unknown (its shim is busy): next round")
			continue
		}
		if sb.AutoPause && sb.State == "running" {
			if err := s.be.Pause(ctx, sb.SandboxID); err != nil {
				log.WithError(err).Warn("reaper: pause an expired sandbox")
			} else {
				log.Info("reaper: sandbox past its timeout paused (autoPause)")
			}
			continue
		}
		if err := s.be.Delete(ctx, sb.SandboxID); err != nil && !errdefs.IsNotFound(err) {
			log.WithError(err).Warn("reaper: kill an expired sandbox")
			continue
		}
		s.cmds.forget(sb.SandboxID)
		log.Info("reaper: sandbox past its timeout killed")
	}
}

// RunReaper reaps every reap_interval until ctx is done.
func (s *Server) RunReaper(ctx context.Context) {
	t := time.NewTicker(s.dur.Reap)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			rctx, cancel := context.WithTimeout(ctx, s.dur.Request)
			s.Reap(rctx)
			cancel()
		}
	}
}
