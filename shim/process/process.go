// Package process models one container process inside the sandbox VM (the
// container's init or an exec) with an explicit lifecycle:
//
//	created --Start--> running --(exit)--> stopped --Delete--> deleted
//	   |                 |   ^
//	   |               Pause Resume (init only: the VM is frozen)
//	   |                 v   |
//	   |                paused
//	   +--Kill/(exit)--> stopped
//
// A rollback of the VM to a snapshot taken before a process exited brings it
// back: stopped --(rollback)--> running (or created), see rollback.go.
//
// Each state is its own type (like containerd's runc shim process package);
// a method that is not valid in a state returns an ErrFailedPrecondition
// error naming the state.
package process

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/stdio"
)

// Status names a lifecycle state (they map onto containerd's task status).
type Status string

const (
	Created Status = "created"
	Running Status = "running"
	Paused  Status = "paused"
	Stopped Status = "stopped"
	Deleted Status = "deleted"
)

// ExitVMGone is the status of processes whose VM died under them: as if
// SIGKILLed (128+9), so callers see a non-zero exit like runc reports a kill.
const ExitVMGone = 128 + 9

// ExitLost is the status when the agent's Wait failed while the VM lived on.
const ExitLost = 255

// outputDrainTimeout bounds waiting for the last output after an exit: the
// guest closes its streams at EOF, but a grandchild holding stdout open must
// not delay the exit event forever.
const outputDrainTimeout = 2 * time.Second

// Exit is how a process ended.
type Exit struct {
	Status uint32
	At     time.Time
}

// Options create a process.
type Options struct {
	ContainerID string
	ExecID      string // "" for the container's init
	Agent       sandbox.AgentClient
	IO          *stdio.IO // nil when the process has no stdio
	GuestPid    uint32
	// VMDone is closed when the VM is gone; Wait errors then mean ExitVMGone.
	VMDone <-chan struct{}
	// OnExit runs once, after the exit is recorded (the service publishes
	// the exit event there).
	OnExit func(*Process)
	Log    *logrus.Entry
}

// Process is one guest process and its state machine.
type Process struct {
	o      Options
	mu     sync.Mutex
	st     state
	exit   Exit
	exited chan struct{}
	// agent and io are the process's connection to the guest and its host
	// stdio: a rollback replaces the agent connection (rollback.go) and a
	// revived process gets new stdio.
	agent sandbox.AgentClient
	io    *stdio.IO
	// gen counts the agent connections the process has had: a Wait that
	// failed on an older one is re-issued.
	gen uint64
	// held: a rollback is in progress (Hold); rebound is closed when it ends
	// (Rebind, Revive, EndRolledBack or Release).
	held    bool
	rebound chan struct{}
	// startTiming is what the guest said its Start took (StartTiming).
	startTiming string
}

// New returns a process in the created state and starts waiting for its
// exit (a created process can exit too: killed before Start).
func New(o Options) *Process {
	if o.Log == nil {
		o.Log = logrus.NewEntry(logrus.StandardLogger())
	}
	p := &Process{o: o, exited: make(chan struct{}), agent: o.Agent, io: o.IO}
	p.st = &createdState{p}
	go p.waitExit(p.exited)
	return p
}

// ID is the exec id, or the container id for init.
func (p *Process) ID() string {
	if p.o.ExecID == "" {
		return p.o.ContainerID
	}
	return p.o.ExecID
}

// ContainerID returns the container's id.
func (p *Process) ContainerID() string { return p.o.ContainerID }

// ExecID returns the exec id ("" for init).
func (p *Process) ExecID() string { return p.o.ExecID }

// GuestPid returns the pid inside the guest.
func (p *Process) GuestPid() uint32 { return p.o.GuestPid }

// Status returns the current state's name.
func (p *Process) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st.status()
}

// ExitStatus returns the recorded exit (zero before the process stopped).
func (p *Process) ExitStatus() Exit {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exit
}

// Exited is closed when the process has stopped (a revived process gets a
// new one: ask again after a rollback).
func (p *Process) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// Start runs a created process.
func (p *Process) Start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st.start(ctx)
}

// StartTiming is what the last Start took in the guest ("exec=…", ms), for
// the log; empty before a Start or from an agent that does not say.
func (p *Process) StartTiming() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.startTiming
}

// Kill signals the process (all: every process of the container).
func (p *Process) Kill(ctx context.Context, sig uint32, all bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st.kill(ctx, sig, all)
}

// Pause records that the VM was frozen under a running init.
func (p *Process) Pause() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st.pause()
}

// Resume records that the VM runs again.
func (p *Process) Resume() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st.resume()
}

// Delete releases the process in the guest and its host stdio. Allowed when
// created (the process is killed) or stopped.
func (p *Process) Delete(ctx context.Context) (Exit, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.st.delete(ctx); err != nil {
		return Exit{}, err
	}
	return p.exit, nil
}

// CloseIO ends the process's stdin.
func (p *Process) CloseIO(ctx context.Context) error {
	p.mu.Lock()
	st := p.st.status()
	p.mu.Unlock()
	if st == Deleted {
		return p.invalid("close stdin of")
	}
	p.mu.Lock()
	hio, agent := p.io, p.agent
	p.mu.Unlock()
	if hio != nil {
		hio.CloseStdin()
	}
	if st == Stopped || p.vmGone() {
		return nil
	}
	if err := agent.CloseStdin(ctx, p.o.ContainerID, p.o.ExecID); err != nil {
		return fmt.Errorf("close stdin of %s: %w", p.ID(), err)
	}
	return nil
}

// ResizePty sets the terminal size.
func (p *Process) ResizePty(ctx context.Context, w, h uint32) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch p.st.status() {
	case Created, Running:
	default:
		return p.invalid("resize the terminal of")
	}
	if err := p.agent.ResizePty(ctx, p.o.ContainerID, p.o.ExecID, w, h); err != nil {
		return fmt.Errorf("resize terminal of %s: %w", p.ID(), err)
	}
	return nil
}

// SetExited records the exit (first call wins) and runs OnExit.
func (p *Process) SetExited(e Exit) {
	p.mu.Lock()
	exited := p.exited
	changed := p.st.setExited(e)
	p.mu.Unlock()
	if changed {
		// The exit event goes out before waiters are released, so a client
		// that saw Wait return also finds the event published.
		if p.o.OnExit != nil {
			p.o.OnExit(p)
		}
		close(exited)
	}
}

func (p *Process) vmGone() bool {
	if p.o.VMDone == nil {
		return false
	}
	select {
	case <-p.o.VMDone:
		return true
	default:
		return false
	}
}

// waitExit turns the agent's Wait into SetExited. A failed Wait is an exit
// too: ExitVMGone if the VM is gone (it closes every connection), ExitLost
// otherwise — unless a rollback replaced the connection it was on: it is then
// re-issued on the new one (rollback.go). exited is the channel of the life
// it waits for (a revived process waits anew).
func (p *Process) waitExit(exited chan struct{}) {
	var e Exit
	for {
		p.mu.Lock()
		agent, gen := p.agent, p.gen
		p.mu.Unlock()
		st, err := agent.Wait(context.Background(), p.o.ContainerID, p.o.ExecID)
		if err == nil {
			e = Exit{Status: st.Status, At: st.ExitedAt}
			break
		}
		switch p.afterFailedWait(gen, exited) {
		case waitAgain:
			continue
		case waitDone:
			return
		}
		select {
		case <-p.o.VMDone:
			e = Exit{Status: ExitVMGone, At: time.Now()}
		case <-time.After(outputDrainTimeout):
			p.o.Log.WithError(err).WithField("process", p.ID()).Error("lost track of the guest process")
			e = Exit{Status: ExitLost, At: time.Now()}
		}
		break
	}
	if e.At.IsZero() {
		e.At = time.Now()
	}
	p.mu.Lock()
	hio := p.io
	p.mu.Unlock()
	if hio != nil {
		ctx, cancel := context.WithTimeout(context.Background(), outputDrainTimeout)
		if err := hio.WaitOutput(ctx); err != nil {
			p.o.Log.WithError(err).WithField("process", p.ID()).Warn("output not drained at exit")
		}
		cancel()
	}
	p.SetExited(e)
}

func (p *Process) invalid(what string) error {
	return fmt.Errorf("cannot %s process %s: it is %s: %w", what, p.ID(), p.st.status(), errdefs.ErrFailedPrecondition)
}

func (p *Process) releaseIO() {
	if p.io != nil {
		p.io.Close()
	}
}

// guestDelete removes the process in the guest (nothing to do once the VM
// is gone: it took the process with it).
func (p *Process) guestDelete(ctx context.Context, force bool) error {
	if p.vmGone() {
		return nil
	}
	if _, err := p.agent.Delete(ctx, p.o.ContainerID, p.o.ExecID, force); err != nil {
		return fmt.Errorf("delete process %s in the guest: %w", p.ID(), err)
	}
	return nil
}
