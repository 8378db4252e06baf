// Package vcpu runs KVM vCPUs on dedicated OS threads, dispatches their
// I/O exits to the PIO and MMIO buses, and lets a controller pause, resume
// and stop them.
//
// Kicking a vCPU out of KVM_RUN: the controller records what it wants
// (under the vCPU's mutex), sets kvm_run.immediate_exit and sends SIGURG to
// the vCPU's thread. The signal interrupts a running KVM_RUN with EINTR;
// immediate_exit covers the window where the thread is about to enter
// KVM_RUN and would otherwise miss the signal. SIGURG is the Go runtime's
// own preemption signal, so its handler is always installed and harmless.
package vcpu

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/hypervisor/bus"
	"github.com/cube-runtime/cube/hypervisor/kvm"
)

// State is a vCPU thread's lifecycle state.
type State int

const (
	Created State = iota // thread not started
	Running              // in or around KVM_RUN
	Paused               // parked outside KVM_RUN; state ioctls are safe
	Stopped              // thread gone; Result is final
)

func (s State) String() string {
	return [...]string{"created", "running", "paused", "stopped"}[s]
}

// Reason says why a vCPU stopped.
type Reason int

const (
	ReasonStopped  Reason = iota // Stop was called
	ReasonHalted                 // HLT exit (no in-kernel irqchip: synthetic guests)
	ReasonShutdown               // guest asked for power-off (system event)
	ReasonReset                  // guest asked for reset, or triple-faulted
	ReasonCrash                  // guest reported a crash (system event)
	ReasonError                  // KVM failure or an exit we cannot continue from
)

func (r Reason) String() string {
	return [...]string{"stopped", "halted", "shutdown", "reset", "crash", "error"}[r]
}

// Result is how a vCPU's thread ended.
type Result struct {
	ID     int
	Reason Reason
	Err    error // set for ReasonError, and describes a triple fault for ReasonReset
}

// ExitCounts counts a vCPU's exits to userspace.
type ExitCounts struct {
	PIO, MMIO, Interrupted, Other atomic.Uint64
}

// VCPU is one vCPU and its run thread.
type VCPU struct {
	CPU  *kvm.VCPU
	PIO  *bus.Bus
	MMIO *bus.Bus
	// Unclaimed, if set, sees accesses no device claimed (for debugging).
	Unclaimed func(pio, write bool, addr uint64, data []byte)
	// Exits counts userspace exits by kind, for diagnostics.
	Exits ExitCounts

	mu    sync.Mutex
	cond  sync.Cond
	want  State // Running, Paused or Stopped: what the controller asked for
	state State
	// started is set by Start before it spawns the thread: from then on
	// the thread owns done, even while state is still Created.
	started bool
	tid     int
	result  Result
	done    chan struct{}
}

// New wraps cpu; pio and mmio may be shared by all vCPUs of a VM.
func New(cpu *kvm.VCPU, pio, mmio *bus.Bus) *VCPU {
	v := &VCPU{CPU: cpu, PIO: pio, MMIO: mmio, want: Running, done: make(chan struct{})}
	v.cond.L = &v.mu
	return v
}

// State reports the current state.
func (v *VCPU) State() State {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.state
}

// Start launches the run thread. onExit, if non-nil, is called from that
// thread once, when it ends.
func (v *VCPU) Start(onExit func(Result)) {
	v.mu.Lock()
	if v.state != Created || v.started {
		v.mu.Unlock()
		return
	}
	v.started = true
	v.mu.Unlock()
	started := make(chan struct{})
	go v.run(onExit, started)
	<-started
}

// run is the vCPU's thread. Ordering: the goroutine locks its thread
// before it names it; when that thread is the process's main thread (the
// runtime may pick it while Start's caller waits), whose name is the
// process's (ps, pgrep, /proc/PID/comm), the loop moves to another thread:
// the main thread stays locked to this goroutine until the new one has
// locked its own, so the runtime cannot give it the main thread again.
func (v *VCPU) run(onExit func(Result), started chan struct{}) {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		moved := make(chan struct{})
		go v.loopThread(onExit, started, moved)
		<-moved
		runtime.UnlockOSThread()
		return
	}
	v.loopThread(onExit, started, nil)
}

func (v *VCPU) loopThread(onExit func(Result), started, moved chan struct{}) {
	// Never unlocked: the thread dies with the goroutine, so no other
	// goroutine inherits a thread whose tid we may still signal.
	runtime.LockOSThread()
	if moved != nil {
		close(moved)
	}
	// The thread's name, as QEMU's "CPU 0/KVM": ps, top and /proc
	// then tell guest time (this thread) from the VMM's own.
	_ = unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&threadName(v.CPU.ID())[0])), 0, 0, 0)
	v.mu.Lock()
	v.tid = unix.Gettid()
	v.state = Running
	v.mu.Unlock()
	close(started)
	res := v.loop()
	v.mu.Lock()
	v.result = res
	v.state = Stopped
	v.cond.Broadcast()
	v.mu.Unlock()
	close(v.done)
	if onExit != nil {
		onExit(res)
	}
}

// Done is closed when the thread has ended.
func (v *VCPU) Done() <-chan struct{} { return v.done }

// Result is valid after Done is closed.
func (v *VCPU) Result() Result {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.result
}

// kick forces the thread out of KVM_RUN. Caller holds v.mu, which keeps
// the thread (and so its tid) alive: it cannot reach Stopped without it.
func (v *VCPU) kick() {
	if v.state != Running {
		return
	}
	v.CPU.SetImmediateExit(true)
	// ESRCH cannot happen while the thread lives; any error is harmless
	// because immediate_exit alone makes the next KVM_RUN return.
	_ = unix.Tgkill(unix.Getpid(), v.tid, unix.SIGURG)
}

// RequestPause asks the thread to park, without waiting.
func (v *VCPU) RequestPause() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.want == Running {
		v.want = Paused
		v.kick()
	}
}

// WaitPaused blocks until the thread is parked (or stopped).
func (v *VCPU) WaitPaused() State {
	v.mu.Lock()
	defer v.mu.Unlock()
	for v.want == Paused && v.state != Paused && v.state != Stopped {
		v.cond.Wait()
	}
	return v.state
}

// Resume lets a paused thread re-enter the guest.
func (v *VCPU) Resume() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.want == Paused {
		v.want = Running
		v.cond.Broadcast()
	}
}

// RequestStop asks the thread to end, without waiting.
func (v *VCPU) RequestStop() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.want = Stopped
	if v.state == Created && !v.started {
		// Never started: there is no thread to wait for. Ordering: a
		// thread Start has spawned but that has not yet set Running is
		// not this case; it sees want == Stopped, ends and closes done.
		v.state = Stopped
		v.result = Result{ID: v.CPU.ID(), Reason: ReasonStopped}
		close(v.done)
		return
	}
	v.kick()
	v.cond.Broadcast()
}

// loop is the run thread's body.
func (v *VCPU) loop() Result {
	id := v.CPU.ID()
	for {
		v.mu.Lock()
		for v.want == Paused {
			if v.state != Paused {
				// Finish a pending I/O exit (KVM copies IN data to RAX and
				// advances RIP only on the next KVM_RUN) without entering
				// the guest, so a paused vCPU's saved state is complete.
				v.CPU.SetImmediateExit(true)
				_ = v.CPU.Run()
				v.CPU.SetImmediateExit(false)
				v.state = Paused
				v.cond.Broadcast()
			}
			v.cond.Wait()
		}
		if v.want == Stopped {
			v.mu.Unlock()
			return Result{ID: id, Reason: ReasonStopped}
		}
		v.state = Running
		v.mu.Unlock()

		err := v.CPU.Run()
		if errors.Is(err, kvm.ErrInterrupted) {
			v.Exits.Interrupted.Add(1)
			// Clear before re-checking want (next iteration): a kick that
			// set want earlier is seen; a later one sets the flag again.
			v.CPU.SetImmediateExit(false)
			continue
		}
		if err != nil {
			return Result{ID: id, Reason: ReasonError, Err: err}
		}
		if res, done := v.handleExit(); done {
			res.ID = id
			return res
		}
	}
}

// handleExit services one exit; done reports that the thread must end.
func (v *VCPU) handleExit() (Result, bool) {
	rd := v.CPU.RunData()
	switch rs := rd.ExitReason(); rs {
	case kvm.ExitIO:
		v.Exits.PIO.Add(1)
		e, err := rd.IO()
		if err != nil {
			return Result{Reason: ReasonError, Err: err}, true
		}
		// String I/O (rep ins/outs) repeats the access Count times.
		for i := 0; i+int(e.Size) <= len(e.Data); i += int(e.Size) {
			chunk := e.Data[i : i+int(e.Size)]
			var ok bool
			if e.Direction == kvm.IODirOut {
				ok = v.PIO.Write(uint64(e.Port), chunk)
			} else {
				ok = v.PIO.Read(uint64(e.Port), chunk)
			}
			if !ok && v.Unclaimed != nil {
				v.Unclaimed(true, e.Direction == kvm.IODirOut, uint64(e.Port), chunk)
			}
		}
	case kvm.ExitMMIO:
		v.Exits.MMIO.Add(1)
		e, err := rd.MMIO()
		if err != nil {
			return Result{Reason: ReasonError, Err: err}, true
		}
		var ok bool
		if e.IsWrite {
			ok = v.MMIO.Write(e.Addr, e.Data)
		} else {
			ok = v.MMIO.Read(e.Addr, e.Data)
		}
		if !ok && v.Unclaimed != nil {
			v.Unclaimed(false, e.IsWrite, e.Addr, e.Data)
		}
	case kvm.ExitHLT:
		return Result{Reason: ReasonHalted}, true
	case kvm.ExitIntr, kvm.ExitIRQWindowOpen, kvm.ExitIOAPICEOI:
		v.Exits.Other.Add(1)
		// Nothing to do; the loop re-checks want and re-enters.
	case kvm.ExitSystemEvent:
		typ, data := rd.SystemEvent()
		switch typ {
		case kvm.SystemEventShutdown:
			return Result{Reason: ReasonShutdown}, true
		case kvm.SystemEventReset:
			return Result{Reason: ReasonReset}, true
		case kvm.SystemEventCrash:
			return Result{Reason: ReasonCrash, Err: fmt.Errorf("guest crash event, data %#x", data)}, true
		default:
			return Result{Reason: ReasonError, Err: fmt.Errorf("unknown system event %d, data %#x", typ, data)}, true
		}
	case kvm.ExitShutdown:
		// A triple fault; Linux uses one as its last-resort reboot.
		return Result{Reason: ReasonReset, Err: errors.New("triple fault")}, true
	default:
		err := rd.ExitError()
		if err == nil {
			err = fmt.Errorf("unhandled exit %v", rs)
		}
		if regs, rerr := v.CPU.GetRegs(); rerr == nil {
			err = fmt.Errorf("%w (rip %#x)", err, regs.RIP)
		}
		return Result{Reason: ReasonError, Err: err}, true
	}
	return Result{}, false
}

// Set is all vCPUs of a VM, controlled together.
type Set []*VCPU

// Pause parks every vCPU and returns when all are parked or stopped.
func (s Set) Pause() {
	for _, v := range s {
		v.RequestPause()
	}
	for _, v := range s {
		v.WaitPaused()
	}
}

// Resume lets every vCPU run again.
func (s Set) Resume() {
	for _, v := range s {
		v.Resume()
	}
}

// Stop ends every thread and waits for them.
func (s Set) Stop() {
	for _, v := range s {
		v.RequestStop()
	}
	for _, v := range s {
		<-v.done
	}
}

// threadName is the NUL-terminated name of vCPU id's thread ("vcpu0").
func threadName(id int) []byte { return append([]byte(fmt.Sprintf("vcpu%d", id)), 0) }
