package vcpu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/cube-runtime/cube/hypervisor/bus"
	"github.com/cube-runtime/cube/hypervisor/kvm"
	"github.com/cube-runtime/cube/hypervisor/kvmtest"
	"golang.org/x/sys/unix"
)

func newGuest(t *testing.T, code []byte) *kvmtest.Guest {
	t.Helper()
	g, err := kvmtest.NewGuest(kvm.DefaultDevice, code, kvmtest.GuestOptions{})
	if errors.Is(err, kvmtest.ErrNoKVM) {
		t.Skipf("no KVM on this machine: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return g
}

type access struct {
	write bool
	off   uint64
	data  []byte
}

type fakeDev struct {
	mu   sync.Mutex
	log  []access
	read []byte // what reads return
}

func (d *fakeDev) Read(off uint64, data []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	copy(data, d.read)
	d.log = append(d.log, access{false, off, append([]byte(nil), data...)})
}

func (d *fakeDev) Write(off uint64, data []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.log = append(d.log, access{true, off, append([]byte(nil), data...)})
}

func waitDone(t *testing.T, v *VCPU) Result {
	t.Helper()
	select {
	case <-v.Done():
		return v.Result()
	case <-time.After(60 * time.Second):
		v.RequestStop()
		t.Fatal("vcpu did not finish within 60s")
		return Result{}
	}
}

// The guest reads port 0x100, increments, writes it back; reads MMIO at
// 256 MiB, increments, writes it to 256 MiB + 8; halts.
func TestPIOAndMMIODispatch(t *testing.T) {
	code := []byte{
		0x66, 0xba, 0x00, 0x01, // mov dx, 0x100
		0xec,       // in al, dx
		0xfe, 0xc0, // inc al
		0xee,                                     // out dx, al
		0x8b, 0x04, 0x25, 0x00, 0x00, 0x00, 0x10, // mov eax, [0x10000000]
		0x83, 0xc0, 0x01, // add eax, 1
		0x89, 0x04, 0x25, 0x08, 0x00, 0x00, 0x10, // mov [0x10000008], eax
		0xf4, // hlt
	}
	g := newGuest(t, code)
	var pio, mmio bus.Bus
	port := &fakeDev{read: []byte{0x41}}
	reg := &fakeDev{read: []byte{0x44, 0x33, 0x22, 0x11}}
	if err := pio.Register(0x100, 1, "port", port); err != nil {
		t.Fatal(err)
	}
	if err := mmio.Register(0x10000000, 0x10, "regs", reg); err != nil {
		t.Fatal(err)
	}
	v := New(g.CPU, &pio, &mmio)
	v.Start(nil)
	res := waitDone(t, v)
	if res.Reason != ReasonHalted {
		t.Fatalf("result %+v, want halted", res)
	}
	if len(port.log) != 2 || port.log[0].write || !port.log[1].write || port.log[1].data[0] != 0x42 {
		t.Errorf("port accesses %+v, want read then write of 0x42", port.log)
	}
	if len(reg.log) != 2 || reg.log[0].write || reg.log[0].off != 0 || len(reg.log[0].data) != 4 ||
		!reg.log[1].write || reg.log[1].off != 8 || binary.LittleEndian.Uint32(reg.log[1].data) != 0x11223345 {
		t.Errorf("mmio accesses %+v, want 4-byte read at 0 then write of 0x11223345 at 8", reg.log)
	}
}

// loopCode increments the qword at DataAddr forever.
var loopCode = []byte{
	0x48, 0xff, 0x04, 0x25, 0x00, 0x80, 0x00, 0x00, // inc qword [0x8000]
	0xeb, 0xf6, // jmp -10
}

func counter(g *kvmtest.Guest) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&g.Mem[kvmtest.DataAddr]))
}

func waitAbove(t *testing.T, c *atomic.Uint64, min uint64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for c.Load() <= min {
		if time.Now().After(deadline) {
			t.Fatalf("guest counter stuck at %d", c.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

func TestPauseResumeStop(t *testing.T) {
	g := newGuest(t, loopCode)
	var pio, mmio bus.Bus
	v := New(g.CPU, &pio, &mmio)
	exited := make(chan Result, 1)
	v.Start(func(r Result) { exited <- r })
	c := counter(g)
	waitAbove(t, c, 0)
	v.mu.Lock()
	tid := v.tid
	v.mu.Unlock()
	if comm, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/comm", tid)); err != nil || string(comm) != "vcpu0\n" {
		t.Errorf("vCPU thread %d is named %q (%v), want vcpu0", tid, comm, err)
	}

	for round := 0; round < 3; round++ {
		Set{v}.Pause()
		if s := v.State(); s != Paused {
			t.Fatalf("round %d: state %v after Pause", round, s)
		}
		// While paused the vCPU is outside KVM_RUN: state ioctls work and
		// the guest makes no progress.
		regs, err := g.CPU.GetRegs()
		if err != nil {
			t.Fatal(err)
		}
		if regs.RIP < kvmtest.CodeAddr || regs.RIP >= kvmtest.CodeAddr+uint64(len(loopCode)) {
			t.Errorf("paused rip %#x outside the loop", regs.RIP)
		}
		before := c.Load()
		time.Sleep(20 * time.Millisecond)
		if after := c.Load(); after != before {
			t.Fatalf("round %d: counter moved from %d to %d while paused", round, before, after)
		}
		Set{v}.Resume()
		waitAbove(t, c, before)
	}
	Set{v}.Stop()
	if r := <-exited; r.Reason != ReasonStopped || r.Err != nil {
		t.Errorf("exit %+v, want stopped", r)
	}
	if s := v.State(); s != Stopped {
		t.Errorf("state %v after Stop", s)
	}
}

func TestStopWhilePausedAndNeverStarted(t *testing.T) {
	g := newGuest(t, loopCode)
	var pio, mmio bus.Bus
	v := New(g.CPU, &pio, &mmio)
	v.Start(nil)
	waitAbove(t, counter(g), 0)
	Set{v}.Pause()
	Set{v}.Stop()
	if r := v.Result(); r.Reason != ReasonStopped {
		t.Errorf("result %+v", r)
	}
	idle := New(g.CPU, &pio, &mmio)
	Set{idle}.Stop() // must not hang
	if idle.State() != Stopped {
		t.Errorf("never-started vcpu state %v", idle.State())
	}
}

// A stop that races a Start (a machine whose other vCPU shut it down while
// this one was starting) ends the thread once: done was closed twice when
// the stop came after Start had spawned the thread but before the thread
// marked itself Running (CI: "close of closed channel" in loopThread).
func TestStopRacingStart(t *testing.T) {
	g := newGuest(t, loopCode)
	var pio, mmio bus.Bus
	for i := 0; i < 300; i++ {
		v := New(g.CPU, &pio, &mmio)
		exits := make(chan Result, 2)
		go v.Start(func(r Result) { exits <- r })
		if i%2 == 1 {
			runtime.Gosched()
		}
		v.RequestStop()
		r := waitDone(t, v)
		if r.Reason != ReasonStopped {
			t.Fatalf("round %d: result %+v, want stopped", i, r)
		}
		v.Start(nil) // a Start after the stop must do nothing
		if s := v.State(); s != Stopped {
			t.Fatalf("round %d: state %v after stop", i, s)
		}
		// onExit runs at most once, and only if the thread ran.
		select {
		case <-exits:
			select {
			case r := <-exits:
				t.Fatalf("round %d: onExit called twice (%+v)", i, r)
			case <-time.After(time.Millisecond):
			}
		default:
		}
	}
}

// BenchmarkPauseResume measures one pause+resume round trip of a spinning vCPU.
func BenchmarkPauseResume(b *testing.B) {
	g, err := kvmtest.NewGuest(kvm.DefaultDevice, loopCode, kvmtest.GuestOptions{})
	if errors.Is(err, kvmtest.ErrNoKVM) {
		b.Skip("no /dev/kvm")
	}
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	var pio, mmio bus.Bus
	v := New(g.CPU, &pio, &mmio)
	v.Start(nil)
	defer Set{v}.Stop()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		Set{v}.Pause()
		Set{v}.Resume()
	}
}

// mainThread runs calls on the process's main thread (TestMain's goroutine,
// locked to it by init).
var mainThread = make(chan func())

func init() { runtime.LockOSThread() }

func TestMain(m *testing.M) {
	done := make(chan int)
	go func() { done <- m.Run() }()
	for {
		select {
		case f := <-mainThread:
			f()
		case code := <-done:
			os.Exit(code)
		}
	}
}

// A vCPU started on the process's main thread moves to another: naming the
// main thread vcpu0 would rename the process (ps, pgrep, /proc/PID/comm).
func TestVCPUNeverRenamesTheProcess(t *testing.T) {
	g := newGuest(t, loopCode)
	var pio, mmio bus.Bus
	v := New(g.CPU, &pio, &mmio)
	before, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan Result, 1)
	started := make(chan struct{})
	ran := make(chan bool)
	mainThread <- func() {
		ran <- unix.Gettid() == unix.Getpid()
		v.run(func(r Result) { exited <- r }, started)
	}
	if !<-ran {
		t.Fatal("mainThread did not run on the main thread")
	}
	<-started
	waitAbove(t, counter(g), 0)
	v.mu.Lock()
	tid := v.tid
	v.mu.Unlock()
	if tid == unix.Getpid() {
		t.Errorf("the vCPU runs on the main thread")
	}
	if after, _ := os.ReadFile("/proc/self/comm"); string(after) != string(before) {
		t.Errorf("process renamed %q → %q", before, after)
	}
	if comm, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/comm", tid)); err != nil || string(comm) != "vcpu0\n" {
		t.Errorf("vCPU thread %d is named %q (%v), want vcpu0", tid, comm, err)
	}
	Set{v}.Stop()
	<-exited
}
