package benchloss

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/vmmcmd"
)

func TestResetStatusIsCubeVMMs(t *testing.T) {
	if CubeVMMReset != vmmcmd.ExitReboot {
		t.Fatalf("CubeVMMReset = %d, cube-vmm's ExitReboot is %d: set CubeVMMReset to it", CubeVMMReset, vmmcmd.ExitReboot)
	}
}

// exitOf runs sh -c script and returns its state: real process states, as the benchmarks get them.
func exitOf(t *testing.T, script string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	cmd.Run()
	if cmd.ProcessState == nil {
		t.Fatalf("sh -c %q did not run", script)
	}
	return cmd
}

func TestExited(t *testing.T) {
	failed := errors.New("cube-vmm exited before BENCH-READY\nconsole tail")
	for _, c := range []struct {
		script string
		reset  int
		lost   string // the reason's start, "" for a real failure
	}{
		{"exit 10", CubeVMMReset, "exit status 10: the guest reset"},
		{"kill -9 $$", CubeVMMReset, "VMM gone: killed by signal 9"},
		{"exit 1", CubeVMMReset, ""},  // cube-vmm's own failure
		{"exit 2", CubeVMMReset, ""},  // usage
		{"exit 11", CubeVMMReset, ""}, // guest panic
		{"exit 0", CubeVMMReset, ""},  // a guest that powered off when it should not have: ours
		{"exit 0", QEMUReset, "exit status 0: the guest reset"},
		{"exit 1", QEMUReset, ""},
	} {
		err := Exited(exitOf(t, c.script).ProcessState, c.reset, failed)
		l, ok := IsLost(err)
		switch {
		case c.lost == "" && ok:
			t.Errorf("%q (reset %d): lost VM (%s), want a real failure", c.script, c.reset, l.Reason)
		case c.lost == "" && err != failed:
			t.Errorf("%q (reset %d): %v, want the error as is", c.script, c.reset, err)
		case c.lost != "" && !ok:
			t.Errorf("%q (reset %d): %v, want a lost VM", c.script, c.reset, err)
		case c.lost != "" && (!strings.HasPrefix(l.Reason, c.lost) || !errors.Is(err, failed)):
			t.Errorf("%q (reset %d): %q wrapping %v, want %q… wrapping the failure", c.script, c.reset, l.Reason, l.Err, c.lost)
		}
	}
	if Exited(nil, CubeVMMReset, failed) != failed || Exited(exitOf(t, "exit 10").ProcessState, CubeVMMReset, nil) != nil {
		t.Error("Exited with no process state or no error must return the error as is")
	}
}

func TestExitedStatus(t *testing.T) {
	failed := errors.New("boot failed")
	for _, c := range []struct {
		code int
		lost bool
	}{{10, true}, {-1, true}, {1, false}, {11, false}, {0, false}} {
		if _, ok := IsLost(ExitedStatus(c.code, CubeVMMReset, failed)); ok != c.lost {
			t.Errorf("status %d: lost %v, want %v", c.code, ok, c.lost)
		}
	}
}

func TestMarksSurviveWrapping(t *testing.T) {
	base := errors.New("no \"PONG\" in 1m0s")
	err := fmt.Errorf("rollback sample 3: %w", Stalled(base))
	l, ok := IsLost(err)
	if !ok || !strings.HasPrefix(l.Reason, "stall") || !errors.Is(err, base) {
		t.Fatalf("a wrapped stall: %v (lost %v)", err, ok)
	}
	// The first classification wins: a stall of a VMM that then exited keeps "stall".
	if l, _ := IsLost(Gone("status 10", err)); !strings.HasPrefix(l.Reason, "stall") {
		t.Errorf("re-marking changed the reason to %q", l.Reason)
	}
	if _, ok := IsLost(errors.New("rollback: memory \"remap\", want rewrite-dirty")); ok {
		t.Error("a plain error counts as a lost VM")
	}
	if Lost("x", nil) != nil || Stalled(nil) != nil {
		t.Error("marking nil must stay nil")
	}
}

// fakeTB records Fatal instead of ending the test.
type fakeTB struct {
	testing.TB
	fatal string
}

func (f *fakeTB) Helper()           {}
func (f *fakeTB) Log(args ...any)   {}
func (f *fakeTB) Fatal(args ...any) { f.fatal = fmt.Sprint(args...) }

func counter(perSample, total int) (*Counter, *bytes.Buffer) {
	var out bytes.Buffer
	return &Counter{PerSample: perSample, Total: total, Out: &out}, &out
}

func TestSampleRetriesLostVMs(t *testing.T) {
	c, out := counter(3, 10)
	calls := 0
	err := c.Sample("restore 1", func() error {
		calls++
		if calls < 3 {
			return Exited(exitOf(t, "exit 10").ProcessState, CubeVMMReset, errors.New("cube-vmm exited\nconsole: [ 0.1] reset"))
		}
		return nil
	})
	if err != nil || calls != 3 || c.N() != 2 {
		t.Fatalf("Sample: %v after %d calls, %d lost; want nil after 3 calls, 2 lost", err, calls, c.N())
	}
	if !strings.Contains(out.String(), "LOST VM 2 (restore 1; left out of the medians)") || !strings.Contains(out.String(), "console: [ 0.1] reset") {
		t.Errorf("a loss is printed with its evidence; got:\n%s", out)
	}
}

func TestRealErrorIsNotRetried(t *testing.T) {
	c, _ := counter(3, 10)
	real := errors.New("rollback: memory \"remap\", want rewrite-dirty")
	calls := 0
	err := c.Sample("rollback 1", func() error { calls++; return real })
	if err != real || calls != 1 || c.N() != 0 {
		t.Fatalf("Sample: %v after %d calls, %d lost; want the real error after 1 call, 0 lost", err, calls, c.N())
	}
	tb := &fakeTB{}
	if !c.Stop(tb, err) || !strings.Contains(tb.fatal, "want rewrite-dirty") {
		t.Errorf("Stop on a real error: fatal %q, want the benchmark failed with it", tb.fatal)
	}
}

func TestPerSampleBound(t *testing.T) {
	c, _ := counter(3, 10)
	calls := 0
	err := c.Sample("boot 1", func() error { calls++; return Stalled(errors.New("no BENCH-READY")) })
	if !errors.Is(err, ErrBound) || calls != 4 || c.N() != 4 {
		t.Fatalf("Sample: %v after %d calls, %d lost; want ErrBound after 4 calls (3 allowed), 4 lost", err, calls, c.N())
	}
	tb := &fakeTB{}
	if !c.Stop(tb, err) || tb.fatal != "" {
		t.Errorf("Stop on the bound: fatal %q, want the loop stopped and no failure yet", tb.fatal)
	}
	c.Check(tb)
	if !strings.Contains(tb.fatal, "4 VMs in a row") {
		t.Errorf("Check after the bound: fatal %q, want the bound named", tb.fatal)
	}
	// Once over, later samples do not run.
	if err := c.Sample("boot 2", func() error { t.Error("a sample ran after the bound"); return nil }); !errors.Is(err, ErrBound) {
		t.Errorf("Sample after the bound: %v", err)
	}
}

func TestTotalBound(t *testing.T) {
	c, _ := counter(3, 4)
	lost := Gone("status 10", errors.New("ctr run: rc 137"))
	for i := range 4 {
		c.Begin()
		if err := c.Lost(fmt.Sprintf("sample %d", i), lost); err != nil {
			t.Fatalf("loss %d of 4 allowed: %v", i+1, err)
		}
	}
	c.Begin()
	if err := c.Lost("sample 4", lost); !errors.Is(err, ErrBound) || !strings.Contains(err.Error(), "5 lost in this benchmark (bound 4)") {
		t.Fatalf("fifth loss with a total of 4: %v", err)
	}
	tb := &fakeTB{}
	c.Check(tb)
	if tb.fatal == "" {
		t.Error("Check passed after the total bound was exceeded")
	}
}

func TestSummary(t *testing.T) {
	c, _ := counter(3, 10)
	tb := &fakeTB{}
	c.Check(tb)
	if tb.fatal != "" || !strings.HasPrefix(c.Summary(), "lost VMs: 0 ") {
		t.Errorf("no losses: fatal %q, summary %q", tb.fatal, c.Summary())
	}
	c.Lost("QEMU save 4", Stalled(errors.New("qmp query-migrate: no answer in 3m0s\nconsole tail")))
	s := c.Summary()
	want := "lost VMs: 1 (left out of the medians; bounds 3 per sample, 10 in all)\n  QEMU save 4: stall: no answer before the timeout: qmp query-migrate: no answer in 3m0s\n"
	if s != want {
		t.Errorf("summary:\n%q\nwant\n%q", s, want)
	}
	c.Check(tb)
	if tb.fatal != "" {
		t.Errorf("one loss within the bounds failed the benchmark: %s", tb.fatal)
	}
}

func TestRun(t *testing.T) {
	c, _ := counter(1, 2)
	var took []int
	lostOnce := map[int]bool{}
	ok := c.Run(&fakeTB{}, 4, "save", func(i int) error {
		if !lostOnce[i] {
			lostOnce[i] = true
			return Stalled(errors.New("no answer"))
		}
		took = append(took, i)
		return nil
	})
	// Samples 0 and 1 each lose one VM (within 1 per sample); sample 2's loss is the third in all (bound 2).
	if ok || fmt.Sprint(took) != "[0 1]" || c.N() != 3 || !errors.Is(c.Err(), ErrBound) {
		t.Fatalf("Run: ok %v, took %v, %d lost, err %v; want false, [0 1], 3, ErrBound", ok, took, c.N(), c.Err())
	}
}

func TestSandbox(t *testing.T) {
	failed := errors.New("ctr run: rc 1")
	for _, c := range []struct {
		evidence string
		lost     string // the reason's start, "" for a real failure
	}{
		{`ctr: sandbox cube-cold3: vmm exited while waiting for the agent: status 10 (vmm exited with status 10) (console log: /x)`, "VMM gone: cube-vmm exit status 10"},
		{`level=error msg="sandbox VM died; ending its tasks" error="vmm killed by signal 9 (killed)" vmm_status=137`, "VMM gone: cube-vmm killed by signal 9"},
		{`level=error msg="sandbox VM died; ending its tasks" vmm_status=10`, "VMM gone: cube-vmm exit status 10"},
		{`agent did not answer before the boot timeout: context deadline exceeded`, "stall"},
		{`vmm exited while waiting for the agent: status 1 (vmm exited with status 1)`, ""}, // cube-vmm's own failure
		{`vmm exited with status 11`, ""}, // guest panic
		{`ctr: failed to create shim task: mount rootfs: no such device`, ""},
		{``, ""},
	} {
		err := Sandbox(c.evidence, failed)
		l, ok := IsLost(err)
		switch {
		case c.lost == "" && err != failed:
			t.Errorf("%q: %v, want the real failure as is", c.evidence, err)
		case c.lost != "" && (!ok || !strings.HasPrefix(l.Reason, c.lost)):
			t.Errorf("%q: %v, want a lost VM (%s…)", c.evidence, err, c.lost)
		}
	}
}
