package process

import (
	"context"
	"fmt"
)

// A container restored from a checkpoint (shim/task, restore.go) is
// "created from checkpoint", as runc's shim says: its init already runs in
// the restored guest, whose VM the task service keeps paused until Start.
//
//	restored --Start (resume the VM)--> running
//	    |
//	    +--Kill / Delete: the VM resumes first, then as for created

// NewRestored returns the init of a container restored from a checkpoint,
// in the restored state (status Created), waiting for its exit. resume runs
// the VM again; Start, Kill and Delete call it first.
func NewRestored(o Options, resume func(context.Context) error) *Process {
	p := New(o)
	p.mu.Lock()
	if _, ok := p.st.(*createdState); ok { // not exited meanwhile
		p.st = &restoredState{p: p, resumeFn: resume}
	}
	p.mu.Unlock()
	return p
}

type restoredState struct {
	p        *Process
	resumeFn func(context.Context) error
}

func (s *restoredState) status() Status { return Created }

func (s *restoredState) resumeVM(ctx context.Context) error {
	if err := s.resumeFn(ctx); err != nil {
		return fmt.Errorf("resume the VM restored for %s: %w", s.p.ID(), err)
	}
	return nil
}

// start resumes the VM: the process runs on from the checkpoint.
func (s *restoredState) start(ctx context.Context) error {
	if err := s.resumeVM(ctx); err != nil {
		return err
	}
	s.p.st = &runningState{s.p}
	return nil
}

func (s *restoredState) kill(ctx context.Context, sig uint32, all bool) error {
	if err := s.resumeVM(ctx); err != nil {
		return err
	}
	s.p.st = &runningState{s.p}
	return signal(ctx, s.p, sig, all)
}

func (s *restoredState) pause() error  { return s.p.invalid("pause") }
func (s *restoredState) resume() error { return s.p.invalid("resume") }

// delete kills it (it never started), as for a created process.
func (s *restoredState) delete(ctx context.Context) error {
	if s.p.vmGone() {
		return (&createdState{s.p}).delete(ctx) // nothing left to kill
	}
	if err := s.resumeVM(ctx); err != nil {
		return err
	}
	return (&createdState{s.p}).delete(ctx)
}

func (s *restoredState) revive(bool) error { return s.p.invalid("revive") }

func (s *restoredState) setExited(e Exit) bool {
	s.p.exit = e
	s.p.st = &stoppedState{s.p}
	return true
}
