package process

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/sandbox/sandboxtest"
)

// stubAgent embeds the fake agent and overrides Wait so the test controls exits.
type stubAgent struct {
	*sandboxtest.Agent
	mu      sync.Mutex
	exits   chan sandbox.ExitStatus
	waitErr error
}

func (a *stubAgent) Wait(ctx context.Context, cid, eid string) (sandbox.ExitStatus, error) {
	st, ok := <-a.exits
	if !ok {
		return sandbox.ExitStatus{}, a.waitErr
	}
	return st, nil
}

func (a *stubAgent) Start(ctx context.Context, cid, eid string) (uint32, string, error) {
	return 7, "", nil
}
func (a *stubAgent) Signal(ctx context.Context, cid, eid string, sig uint32, all bool) error {
	return nil
}
func (a *stubAgent) Delete(ctx context.Context, cid, eid string, force bool) (sandbox.ExitStatus, error) {
	return sandbox.ExitStatus{}, nil
}

func newTestProcess(t *testing.T, vmDone chan struct{}) (*Process, *stubAgent, chan Exit) {
	a := &stubAgent{Agent: sandboxtest.NewAgent(), exits: make(chan sandbox.ExitStatus, 1), waitErr: errors.New("connection reset")}
	exits := make(chan Exit, 4)
	p := New(Options{ContainerID: "c", Agent: a, VMDone: vmDone, OnExit: func(p *Process) { exits <- p.ExitStatus() }})
	return p, a, exits
}

func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	p, a, exits := newTestProcess(t, nil)
	if p.Status() != Created {
		t.Fatal(p.Status())
	}
	for name, err := range map[string]error{"pause": p.Pause(), "resume": p.Resume()} {
		if !errdefs.IsFailedPrecondition(err) {
			t.Errorf("%s while created: %v", name, err)
		}
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("second start: %v", err)
	}
	if _, err := p.Delete(ctx); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("delete while running: %v", err)
	}
	if err := p.Pause(); err != nil || p.Status() != Paused {
		t.Fatalf("pause: %v %s", err, p.Status())
	}
	if err := p.Kill(ctx, 9, false); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("kill while paused: %v", err)
	}
	if err := p.Resume(); err != nil || p.Status() != Running {
		t.Fatalf("resume: %v %s", err, p.Status())
	}
	at := time.Unix(100, 0)
	a.exits <- sandbox.ExitStatus{Status: 143, Signal: 15, ExitedAt: at}
	<-p.Exited()
	if e := <-exits; e.Status != 143 || !e.At.Equal(at) {
		t.Fatalf("exit %+v", e)
	}
	// A second exit report (say, the VM dying later) changes nothing.
	p.SetExited(Exit{Status: 1})
	if p.ExitStatus().Status != 143 || len(exits) != 0 {
		t.Fatal("exit recorded twice")
	}
	if err := p.Kill(ctx, 9, false); !errdefs.IsNotFound(err) {
		t.Fatalf("kill after exit: %v", err)
	}
	if e, err := p.Delete(ctx); err != nil || e.Status != 143 || p.Status() != Deleted {
		t.Fatalf("delete: %+v %v %s", e, err, p.Status())
	}
	if _, err := p.Delete(ctx); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("second delete: %v", err)
	}
}

func TestWaitFailureWhenVMGoneIsSIGKILL(t *testing.T) {
	vmDone := make(chan struct{})
	p, a, exits := newTestProcess(t, vmDone)
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(vmDone)
	close(a.exits) // the agent's Wait fails: the connection went with the VM
	<-p.Exited()
	if e := <-exits; e.Status != ExitVMGone {
		t.Fatalf("exit %d, want %d", e.Status, ExitVMGone)
	}
}

func TestPausedProcessEndsWhenVMDies(t *testing.T) {
	p, _, exits := newTestProcess(t, nil)
	p.Start(context.Background())
	p.Pause()
	p.SetExited(Exit{Status: ExitVMGone, At: time.Now()})
	if p.Status() != Stopped || (<-exits).Status != ExitVMGone {
		t.Fatal("paused process did not stop")
	}
}
