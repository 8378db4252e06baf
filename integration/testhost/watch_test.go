package testhost

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestWatchConsoleStopsOnLockup(t *testing.T) {
	p := filepath.Join(t.TempDir(), "console.log")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make(chan string, 2)
	done := make(chan struct{})
	defer close(done)
	go watchConsole(p, done, nil, func(l string) { got <- l })

	f.WriteString("[    1.0] booting\n[ 2.0] rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:\n")
	select {
	case l := <-got:
		t.Fatalf("a transient stall report stopped the run: %q", l)
	case <-time.After(2500 * time.Millisecond):
	}
	// The line arrives in two writes: only the finished line counts.
	f.WriteString("[ 3.0] watchdog: BUG: soft lockup - CPU#1 stu")
	time.Sleep(1500 * time.Millisecond)
	f.WriteString("ck for 22s! [qemu-system-x86:132]\n")
	select {
	case l := <-got:
		if l != "watchdog: BUG: soft lockup - CPU#1 stuck for 22s! [qemu-system-x86:132]" {
			t.Fatalf("reported %q", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("soft lockup not reported")
	}
}

func TestWatchConsoleSilence(t *testing.T) {
	old := silentLimit
	silentLimit = 2500 * time.Millisecond
	defer func() { silentLimit = old }()
	p := filepath.Join(t.TempDir(), "console.log")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make(chan string, 1)
	done := make(chan struct{})
	defer close(done)
	started := make(chan struct{})
	go watchConsole(p, done, started, func(l string) { got <- l })
	// Before the payload starts, silence is not judged (the kernel boots quietly).
	f.WriteString("[    1.0] booting\n")
	select {
	case l := <-got:
		t.Fatalf("silence before the payload started stopped the run: %q", l)
	case <-time.After(4 * time.Second):
	}
	select {
	case <-started:
		t.Fatal("started closed before stage 2 said the payload starts")
	default:
	}
	// Liveness lines keep it going...
	f.WriteString("cube-testhost: payload starts at 3.5s\n")
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("started not closed once the payload started")
	}
	for i := 0; i < 3; i++ {
		time.Sleep(1500 * time.Millisecond)
		f.WriteString(fmt.Sprintf("cube-testhost: still running at %d.0s, load 1 1 1\n", 60*(i+1)))
	}
	select {
	case l := <-got:
		t.Fatalf("a live test host was stopped: %q", l)
	default:
	}
	// ...and their absence ends it.
	select {
	case l := <-got:
		if !strings.Contains(l, "no sign of life") {
			t.Fatalf("reported %q", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a silent test host was not reported")
	}
}

func TestLockMachineSerializes(t *testing.T) {
	old, oldSlots := lockPath, machineSlots
	lockPath, machineSlots = filepath.Join(t.TempDir(), "lock"), 2
	defer func() { lockPath, machineSlots = old, oldSlots }()
	logf := func(string, ...any) {}
	unlock, err := lockMachine(context.Background(), 2, logf)
	if err != nil {
		t.Fatal(err)
	}
	// A second holder (another open file description, as another process would have) waits, even for one
	// core: the first holds both.
	ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
	defer cancel()
	if _, err := lockMachine(ctx, 1, logf); err == nil {
		t.Fatal("second lock taken while the first holds every core")
	}
	unlock()
	unlock2, err := lockMachine(context.Background(), 2, logf)
	if err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
	unlock2()
}

func TestLockMachineOneCoreEach(t *testing.T) {
	old, oldSlots := lockPath, machineSlots
	lockPath, machineSlots = filepath.Join(t.TempDir(), "lock"), 2
	defer func() { lockPath, machineSlots = old, oldSlots }()
	logf := func(string, ...any) {}
	a, err := lockMachine(context.Background(), 1, logf)
	if err != nil {
		t.Fatal(err)
	}
	b, err := lockMachine(context.Background(), 1, logf) // the second core
	if err != nil {
		t.Fatalf("second 1-vCPU test host: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
	defer cancel()
	if _, err := lockMachine(ctx, 1, logf); err == nil {
		t.Fatal("a third 1-vCPU test host got a core of a 2-core machine")
	}
	// A 2-vCPU test host waits for both cores, not just the one freed first.
	a()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 1200*time.Millisecond)
	defer cancel2()
	if _, err := lockMachine(ctx2, 2, logf); err == nil {
		t.Fatal("a 2-vCPU test host started with one core free")
	}
	b()
	c, err := lockMachine(context.Background(), 4, logf) // more vCPUs than cores: all the cores
	if err != nil {
		t.Fatal(err)
	}
	c()
}

func TestKernelReport(t *testing.T) {
	console := []byte("[    1.0] booting\n[    2.0] ok\n[   37.1] BUG: stack guard page was hit at 00000000 (stack is x..y)\n" +
		"[   37.1] kernel stack overflow (double-fault): 0000 [#1] SMP\n[   37.1] Call Trace:\n[   37.3] Kernel panic - not syncing: Fatal exception in interrupt\n")
	got := KernelReport(console, 2)
	want := "[   37.1] BUG: stack guard page was hit at 00000000 (stack is x..y)\n[   37.1] kernel stack overflow (double-fault): 0000 [#1] SMP\n"
	if got != want {
		t.Fatalf("KernelReport = %q, want %q", got, want)
	}
	if r := KernelReport([]byte("[ 1.0] all fine\n"), 5); r != "" {
		t.Fatalf("KernelReport of a healthy console = %q", r)
	}
}
