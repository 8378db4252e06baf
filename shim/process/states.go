package process

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"
)

// state is one lifecycle state; the Process lock is held on every call.
type state interface {
	status() Status
	start(ctx context.Context) error
	kill(ctx context.Context, sig uint32, all bool) error
	pause() error
	resume() error
	delete(ctx context.Context) error
	// setExited moves to stopped; false if the exit was already recorded.
	setExited(e Exit) bool
	// revive moves a stopped process back to running (created: to created)
	// after a rollback to a snapshot taken before it exited.
	revive(created bool) error
}

func signal(ctx context.Context, p *Process, sig uint32, all bool) error {
	if err := p.agent.Signal(ctx, p.o.ContainerID, p.o.ExecID, sig, all); err != nil {
		return fmt.Errorf("signal %d to %s: %w", sig, p.ID(), err)
	}
	return nil
}

type createdState struct{ p *Process }

func (s *createdState) status() Status { return Created }

func (s *createdState) start(ctx context.Context) error {
	p := s.p
	_, timing, err := p.agent.Start(ctx, p.o.ContainerID, p.o.ExecID)
	if err != nil {
		return fmt.Errorf("start %s: %w", p.ID(), err)
	}
	p.startTiming = timing
	p.st = &runningState{p}
	return nil
}

func (s *createdState) kill(ctx context.Context, sig uint32, all bool) error {
	return signal(ctx, s.p, sig, all)
}

func (s *createdState) pause() error  { return s.p.invalid("pause") }
func (s *createdState) resume() error { return s.p.invalid("resume") }

// delete of a created process kills it (it never ran), as runc does.
func (s *createdState) delete(ctx context.Context) error {
	p := s.p
	if err := p.guestDelete(ctx, true); err != nil {
		return err
	}
	p.releaseIO()
	p.st = &deletedState{p}
	return nil
}

func (s *createdState) revive(bool) error { return s.p.invalid("revive") }

func (s *createdState) setExited(e Exit) bool {
	s.p.exit = e
	s.p.st = &stoppedState{s.p}
	return true
}

type runningState struct{ p *Process }

func (s *runningState) status() Status                  { return Running }
func (s *runningState) start(ctx context.Context) error { return s.p.invalid("start") }

func (s *runningState) kill(ctx context.Context, sig uint32, all bool) error {
	return signal(ctx, s.p, sig, all)
}

func (s *runningState) pause() error {
	s.p.st = &pausedState{s.p}
	return nil
}

func (s *runningState) resume() error { return s.p.invalid("resume") }

func (s *runningState) delete(ctx context.Context) error {
	return fmt.Errorf("cannot delete process %s: it is running (kill it first): %w", s.p.ID(), errdefs.ErrFailedPrecondition)
}

func (s *runningState) revive(bool) error { return s.p.invalid("revive") }

func (s *runningState) setExited(e Exit) bool {
	s.p.exit = e
	s.p.st = &stoppedState{s.p}
	return true
}

// pausedState: the VM is frozen, so the agent cannot answer until Resume.
type pausedState struct{ p *Process }

func (s *pausedState) status() Status                  { return Paused }
func (s *pausedState) start(ctx context.Context) error { return s.p.invalid("start") }

func (s *pausedState) kill(ctx context.Context, sig uint32, all bool) error {
	return fmt.Errorf("cannot signal process %s: its VM is paused (resume it first): %w", s.p.ID(), errdefs.ErrFailedPrecondition)
}

func (s *pausedState) pause() error { return s.p.invalid("pause") }

func (s *pausedState) resume() error {
	s.p.st = &runningState{s.p}
	return nil
}

func (s *pausedState) delete(ctx context.Context) error {
	return fmt.Errorf("cannot delete process %s: it is paused: %w", s.p.ID(), errdefs.ErrFailedPrecondition)
}

func (s *pausedState) revive(bool) error { return s.p.invalid("revive") }

// setExited while paused happens when the VM dies while frozen.
func (s *pausedState) setExited(e Exit) bool {
	s.p.exit = e
	s.p.st = &stoppedState{s.p}
	return true
}

type stoppedState struct{ p *Process }

func (s *stoppedState) status() Status                  { return Stopped }
func (s *stoppedState) start(ctx context.Context) error { return s.p.invalid("start") }

func (s *stoppedState) kill(ctx context.Context, sig uint32, all bool) error {
	return fmt.Errorf("process %s already finished: %w", s.p.ID(), errdefs.ErrNotFound)
}

func (s *stoppedState) pause() error  { return s.p.invalid("pause") }
func (s *stoppedState) resume() error { return s.p.invalid("resume") }

func (s *stoppedState) delete(ctx context.Context) error {
	p := s.p
	if err := p.guestDelete(ctx, false); err != nil {
		return err
	}
	p.releaseIO()
	p.st = &deletedState{p}
	return nil
}

func (s *stoppedState) setExited(Exit) bool { return false }

// revive: the guest runs the process again (a rollback to before its exit).
func (s *stoppedState) revive(created bool) error {
	if created {
		s.p.st = &createdState{s.p}
	} else {
		s.p.st = &runningState{s.p}
	}
	return nil
}

type deletedState struct{ p *Process }

func (s *deletedState) status() Status                  { return Deleted }
func (s *deletedState) start(ctx context.Context) error { return s.p.invalid("start") }
func (s *deletedState) kill(ctx context.Context, sig uint32, all bool) error {
	return fmt.Errorf("process %s: %w", s.p.ID(), errdefs.ErrNotFound)
}
func (s *deletedState) pause() error                     { return s.p.invalid("pause") }
func (s *deletedState) resume() error                    { return s.p.invalid("resume") }
func (s *deletedState) delete(ctx context.Context) error { return s.p.invalid("delete") }
func (s *deletedState) setExited(Exit) bool              { return false }
func (s *deletedState) revive(bool) error                { return s.p.invalid("revive") }
