package process

import (
	"io"
	"time"

	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/stdio"
)

// A rollback of the VM resets every connection to the guest, and what the
// guest runs afterwards is what it ran at the snapshot. The task service
// reconciles each process with the guest's (shim/task, rollback.go):
//
//	Hold          before the VMM's op: a Wait that fails meanwhile waits for
//	              the outcome instead of reporting the process lost, and the
//	              stdio keeps its host ends (stdio.IO.Hold)
//	Release       the VMM's op failed: nothing changed, go on as before
//	Rebind        the process exists in the guest as the shim knows it: the
//	              new agent connection, streams re-attached, Wait re-issued
//	Revive        it had exited after the snapshot and runs again (stopped →
//	              running, or created): a new life, new stdio, a new Wait
//	EndRolledBack the snapshot did not have it: it ends with ExitVMGone (137)
//	              and an exit event

// failed-Wait outcomes (afterFailedWait).
const (
	waitFail  = iota // report the process lost (or gone with its VM)
	waitAgain        // a rollback replaced the connection: Wait again
	waitDone         // the life waited for has ended meanwhile
)

// Hold marks a rollback in progress (see above).
func (p *Process) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held {
		return
	}
	p.held, p.rebound = true, make(chan struct{})
	if p.io != nil {
		p.io.Hold()
	}
}

// unholdLocked ends a Hold; p.mu is held.
func (p *Process) unholdLocked() {
	if !p.held {
		return
	}
	p.held = false
	close(p.rebound)
}

// Release ends a Hold without a change: the rollback did not happen.
func (p *Process) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.io != nil {
		p.io.Release()
	}
	p.unholdLocked()
}

// Rebind moves the process onto the agent connection made after a
// rollback, with its streams re-attached (nil for a stream it has not), and
// re-issues a pending Wait there.
func (p *Process) Rebind(agent sandbox.AgentClient, in stdio.HalfCloser, out, errw io.ReadCloser) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.agent = agent
	p.gen++
	if p.io != nil {
		p.io.Reattach(in, out, errw)
	}
	p.unholdLocked()
}

// Revive brings a stopped process back to life after a rollback to a
// snapshot taken while it ran (guestStatus "running") or before it started
// ("created"): same guest process, same pid, new host stdio (hio, nil for
// none; the old one is closed) and a new Wait on agent.
func (p *Process) Revive(agent sandbox.AgentClient, guestStatus string, hio *stdio.IO) error {
	p.mu.Lock()
	if err := p.st.revive(guestStatus == sandbox.GuestCreated); err != nil {
		p.mu.Unlock()
		return err
	}
	old := p.io
	p.agent, p.io = agent, hio
	p.gen++
	p.exit = Exit{}
	exited := make(chan struct{})
	p.exited = exited
	p.unholdLocked()
	p.mu.Unlock()
	if old != nil && old != hio {
		old.Close()
	}
	go p.waitExit(exited)
	return nil
}

// EndRolledBack ends a process the rolled-back guest does not have: exit
// ExitVMGone (137, as if SIGKILLed) and the exit event.
func (p *Process) EndRolledBack() {
	p.mu.Lock()
	if p.io != nil {
		p.io.Release() // its streams ended with the reset: the host ends close
	}
	p.unholdLocked()
	p.mu.Unlock()
	p.SetExited(Exit{Status: ExitVMGone, At: time.Now()})
}

// afterFailedWait decides what a failed Wait on connection gen means for
// the life whose channel is exited.
func (p *Process) afterFailedWait(gen uint64, exited chan struct{}) int {
	p.mu.Lock()
	cur, held, ch := p.gen, p.held, p.rebound
	p.mu.Unlock()
	if cur == gen && held {
		select {
		case <-ch:
		case <-p.o.VMDone:
			return waitFail
		}
		p.mu.Lock()
		cur = p.gen
		p.mu.Unlock()
	}
	select {
	case <-exited:
		return waitDone // ended (EndRolledBack) or revived into a new life
	default:
	}
	p.mu.Lock()
	revived := p.exited != exited
	p.mu.Unlock()
	if revived {
		return waitDone
	}
	if cur != gen {
		return waitAgain
	}
	return waitFail
}
