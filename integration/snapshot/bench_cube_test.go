package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/hypervisor/control"
	"github.com/cube-runtime/cube/integration/benchloss"
)

// The benchmarks' cube-vmm: every helper returns an error rather than failing the benchmark, classified at
// the place that sees it (benchloss): a VMM that exits 10 or is killed, or a wait past its timeout, is a lost
// VM the benchmark replaces; an error from a VMM that runs is a real failure.

type cubeVM struct {
	p   *proc
	ctl *control.Client
}

// cubeArgs boots the bench initramfs in cube-vmm (it fills randMiB of tmpfs with random data and then serves
// console commands), with its control socket at sock.
func cubeArgs(sock string, memMiB, randMiB int) []string {
	return []string{"-kernel", guestKernel, "-initrd", benchInitrd, "-memory", fmt.Sprint(memMiB), "-vcpus", "1",
		"-cmdline", fmt.Sprintf("%s bench.rand=%d", benchCmdline, randMiB), "-console-input", "stdin", "-control", sock}
}

// bootCubeErr boots the bench guest in cube-vmm and waits for BENCH-READY and the control socket.
func bootCubeErr(dir string, memMiB, randMiB int) (*cubeVM, error) {
	sock := filepath.Join(dir, "cube-ctl.sock")
	p, err := startProcErr(cubeVMM, cubeArgs(sock, memMiB, randMiB)...)
	if err != nil {
		return nil, err
	}
	v := &cubeVM{p: p}
	if _, err := p.waitLineErr("BENCH-READY", 5*time.Minute); err != nil {
		p.kill()
		return nil, err
	}
	if v.ctl, err = dialControlErr(p, sock, time.Minute); err != nil {
		p.kill()
		return nil, err
	}
	return v, nil
}

func dialControlErr(p *proc, sock string, timeout time.Duration) (*control.Client, error) {
	deadline := time.Now().Add(timeout)
	for {
		c, err := control.Dial(context.Background(), sock)
		if err == nil {
			return c, nil
		}
		if p.exited() {
			return nil, benchloss.Exited(p.cmd.ProcessState, p.reset, fmt.Errorf("cube-vmm exited (%v): %w\n%s", p.cmd.ProcessState, err, p.tail()))
		}
		if time.Now().After(deadline) {
			return nil, benchloss.Stalled(fmt.Errorf("control socket %s: %w\n%s", sock, err, p.tail()))
		}
		time.Sleep(time.Millisecond)
	}
}

type snapResult struct {
	FrozenMS      float64 `json:"frozen_ms"`
	TotalMS       float64 `json:"total_ms"`
	PrepareMS     float64 `json:"prepare_ms"`
	PrecopyMS     float64 `json:"precopy_ms"`
	MemoryBytes   int64   `json:"memory_bytes"`
	RecopiedBytes int64   `json:"recopied_bytes"`
	Memory        string  `json:"memory"` // rollback: rewrite-dirty, rewrite-diff or rewrite-all
	Pages         int64   `json:"pages_rewritten"`
}

// opTimeout bounds one control op: a VMM whose vCPU is stuck never answers, and the benchmark must go on.
const opTimeout = 3 * time.Minute

// ctlDo runs a control op with opTimeout; a failure carries the evidence. No answer is a stall, a VMM that
// exited under the op says by its status whether the VM was lost, and an error answer is a real failure.
func (v *cubeVM) ctlDo(what string, f func() error) error {
	err := within(opTimeout, f)
	if _, lost := benchloss.IsLost(err); err != nil && !lost {
		err = v.p.ended(err)
	}
	if err != nil {
		return fmt.Errorf("%s: %w\n%s", what, err, v.evidence())
	}
	return nil
}

// snapshotErr is a control-socket snapshot into dir, timed (round trip), with cube-vmm's figures.
func (v *cubeVM) snapshotErr(dir string, incremental bool) (time.Duration, snapResult, error) {
	return v.timedOp("snapshot "+dir, func() (snapResult, error) {
		r, err := v.ctl.Snapshot(context.Background(), dir, incremental)
		return snapResult{FrozenMS: r.FrozenMS, TotalMS: r.TotalMS, PrecopyMS: r.PrecopyMS, MemoryBytes: r.MemoryBytes,
			RecopiedBytes: r.RecopiedBytes}, err
	})
}

// rollbackErr is an in-place rollback to dir, timed (round trip), with cube-vmm's figures.
func (v *cubeVM) rollbackErr(dir string) (time.Duration, snapResult, error) {
	return v.timedOp("rollback to "+dir, func() (snapResult, error) {
		r, err := v.ctl.Rollback(context.Background(), dir)
		return snapResult{FrozenMS: r.FrozenMS, TotalMS: r.TotalMS, PrepareMS: r.PrepareMS, Memory: r.Memory, Pages: r.Pages}, err
	})
}

func (v *cubeVM) timedOp(what string, op func() (snapResult, error)) (time.Duration, snapResult, error) {
	var r snapResult
	var d time.Duration
	err := v.ctlDo(what, func() error {
		t0 := time.Now()
		var err error
		r, err = op()
		d = time.Since(t0)
		return err
	})
	if err != nil {
		return 0, snapResult{}, err
	}
	return d, r, nil
}

// ping asks the guest to answer on its console: after a rollback, that the rolled-back guest runs.
func (v *cubeVM) ping(tag string) error {
	if _, err := fmt.Fprintf(v.p.stdin, "ping %s\n", tag); err != nil {
		return v.p.ended(fmt.Errorf("ping %s: %w", tag, err))
	}
	_, err := v.p.waitLineErr("PONG "+tag, time.Minute)
	return err
}

// stopErr stops the VM through its control socket; a VM that does not stop is abandoned. A stop whose reply
// is lost (EOF: cube-vmm can close the connection as it exits, before the reply is written) but whose VMM
// exits counts as stopped.
func (v *cubeVM) stopErr() error {
	err := v.ctlDo("stop", func() error { return v.ctl.Stop(context.Background()) })
	if err == nil || errors.Is(err, io.EOF) {
		err = benchloss.Stalled(v.p.waitExit(time.Minute))
	}
	if err != nil {
		v.abandon()
		return err
	}
	v.ctl.Close()
	return nil
}

// abandon ends a VM that failed. It pauses it first (the vCPUs leave KVM_RUN) and stops it through its control
// socket: a SIGKILL of a VMM whose vCPUs are in KVM_RUN was followed by the test host kernel's panics (README
// "Known problems"). Only a VMM that does not stop is killed.
func (v *cubeVM) abandon() {
	if !v.p.exited() && within(20*time.Second, func() error { return v.ctl.Pause(context.Background()) }) == nil &&
		within(20*time.Second, func() error { return v.ctl.Stop(context.Background()) }) == nil {
		v.p.waitExit(30 * time.Second)
	}
	v.ctl.Close()
	v.p.kill()
}

// evidence is what says why a VM failed: its exit status, console and stderr tail, its threads' kernel stacks
// if it still runs, and the test host kernel's KVM, OOM and fault messages.
func (v *cubeVM) evidence() string {
	state := "running"
	if v.p.exited() {
		state = fmt.Sprint(v.p.cmd.ProcessState)
	}
	s := fmt.Sprintf("cube-vmm pid %d: %s; test host: %s\nconsole and stderr:\n%s", v.p.cmd.Process.Pid, state, memAvailable(), v.p.tail())
	if !v.p.exited() {
		s += "\nthreads:\n" + bounded(func() string { return threadStacks(v.p.cmd.Process.Pid) })
	}
	return s + "\ntest host kernel log:\n" + bounded(kernelLog)
}

// restoreCubeErr launches cube-vmm restore and returns the time from the launch to its control socket
// reporting "running" (the socket appears once the vCPUs run); the VM is then stopped (untimed).
func restoreCubeErr(dir, snap string) (time.Duration, error) {
	d, _, err := restoreCubeErrLog(dir, snap, false)
	return d, err
}

// restoreCubeErrLog is restoreCubeErr; with logged, cube-vmm runs with -log-level info and GODEBUG
// gctrace=1,inittrace=1, and the second result is what says where its time went: its log lines with step
// times, its garbage collections, and its package initializers' total.
func restoreCubeErrLog(dir, snap string, logged bool) (time.Duration, string, error) {
	sock := filepath.Join(dir, "cube-restored.sock")
	args, env := []string{"restore", "-control", sock, snap}, []string(nil)
	if logged {
		args = []string{"restore", "-control", sock, "-log-level", "info", snap}
		env = []string{"GODEBUG=gctrace=1,inittrace=1"}
	}
	t0 := time.Now()
	p, err := startProcEnv(env, cubeVMM, args...)
	if err != nil {
		return 0, "", err
	}
	log := func() string {
		p.mu.Lock()
		defer p.mu.Unlock()
		var out []string
		n, initMS := 0, 0.0
		for _, l := range strings.Split(p.errb.String(), "\n") {
			var name string
			var at, clock float64
			switch {
			case strings.Contains(l, "took"), strings.HasPrefix(l, "gc "):
				out = append(out, strings.TrimSpace(l))
			case strings.HasPrefix(l, "init "):
				if k, _ := fmt.Sscanf(l, "init %s @%f ms, %f ms clock", &name, &at, &clock); k == 3 {
					n++
					initMS += clock
				}
			}
		}
		return strings.Join(append(out, fmt.Sprintf("%d package inits: %.1f ms", n, initMS)), "\n")
	}
	defer p.kill()
	ctl, err := dialControlErr(p, sock, time.Minute)
	if err != nil {
		return 0, "", err
	}
	v := &cubeVM{p: p, ctl: ctl}
	for {
		var info struct {
			State string `json:"state"`
		}
		if err := v.ctlDo("info", func() error { return ctl.Info(context.Background(), &info) }); err != nil {
			v.abandon()
			return 0, "", err
		}
		if info.State == "running" {
			break
		}
		time.Sleep(time.Millisecond)
	}
	d := time.Since(t0)
	err = v.stopErr()
	return d, log(), err
}

// launchCost is the median time to run a VMM binary that does nothing (exec → exit): the part of a
// launch-to-running figure that is process start, not restore.
func launchCost(tb testing.TB, name string, args ...string) series {
	var out series
	for range benchRuns {
		t0 := time.Now()
		exec.Command(name, args...).Run() // a usage error is the point
		out = append(out, time.Since(t0))
	}
	return out
}

// cubeBench keeps BenchmarkVsQEMU's cube-vmm VM across its samples; after a failure the VM is dropped and the
// next sample boots a fresh one. The snapshots a VM rolls back to are its own: a fresh VM takes new ones.
type cubeBench struct {
	dir    string
	v      *cubeVM
	rolls  [2]string // two snapshots of v to roll back to, once taken
	parent string    // v's parent (its last snapshot or rollback target); "" in a fresh VM
	tag    int       // console command tags: unique in a VM, since waitLineErr reads its console from the start
}

func (c *cubeBench) vm() (*cubeVM, error) {
	if c.v == nil {
		v, err := bootCubeErr(c.dir, vsMem, vsRand)
		if err != nil {
			return nil, err
		}
		c.v = v
	}
	return c.v, nil
}

// drop abandons the VM, with the snapshots only it could roll back to.
func (c *cubeBench) drop() {
	if c.v != nil {
		c.v.abandon()
		c.v = nil
	}
	for _, s := range c.rolls {
		if s != "" {
			os.RemoveAll(s)
		}
	}
	c.rolls, c.parent = [2]string{}, ""
}

// cleanup drops the VM and removes every snapshot the samples left (the kept full snapshot, cube-0, stays).
func (c *cubeBench) cleanup() {
	c.drop()
	for _, pat := range []string{"roll-*", "cube-inc-*"} {
		m, _ := filepath.Glob(filepath.Join(c.dir, pat))
		for _, p := range m {
			os.RemoveAll(p)
		}
	}
}

// sample is a benchloss sample on the VM (booted if there is none); a failure drops it.
func (c *cubeBench) sample(f func(v *cubeVM, i int) error) func(int) error {
	return func(i int) error {
		v, err := c.vm()
		if err == nil {
			err = f(v, i)
		}
		if err != nil {
			c.drop()
		}
		return err
	}
}

// rollbackSample is sample on a VM with two snapshots of its own to roll back to (rollbackVM).
func (c *cubeBench) rollbackSample(f func(v *cubeVM, i int) error) func(int) error {
	return c.sample(func(v *cubeVM, i int) error {
		if err := c.rollbackVM(v); err != nil {
			return err
		}
		return f(v, i)
	})
}

// rollbackVM gives v two snapshots of its own to roll back to, if it has none yet, and rolls it back to the
// first: then the first is the parent.
func (c *cubeBench) rollbackVM(v *cubeVM) error {
	if c.rolls[0] != "" {
		return nil
	}
	for i := range c.rolls {
		if _, _, err := c.snapshot(v, fmt.Sprintf("roll-%d", i), false); err != nil {
			return err
		}
		c.rolls[i] = c.parent
	}
	_, _, err := c.rollback(v, c.rolls[0], "")
	return err
}

// snapshot takes a snapshot of v into name under dir (an earlier attempt's leftovers removed first: the
// directory must not exist); it becomes the parent.
func (c *cubeBench) snapshot(v *cubeVM, name string, incremental bool) (time.Duration, snapResult, error) {
	p := filepath.Join(c.dir, name)
	os.RemoveAll(p)
	d, r, err := v.snapshotErr(p, incremental)
	if err == nil {
		c.parent = p
	}
	return d, r, err
}

// rollback rolls v back to snap in place, checks the way cube-vmm took (memory: rewrite-dirty, rewrite-diff or rewrite-all; ""
// takes either) — a wrong one is a real failure — and that the rolled-back guest answers on its console (a
// rollback that leaves a guest stalled is a lost VM, not a sample). snap becomes the parent.
func (c *cubeBench) rollback(v *cubeVM, snap, memory string) (time.Duration, snapResult, error) {
	d, r, err := v.rollbackErr(snap)
	if err != nil {
		return 0, r, err
	}
	c.parent = snap
	if memory != "" && r.Memory != memory {
		return 0, r, fmt.Errorf("rollback to %s: memory %q, want %s (cube-vmm chose the wrong way to roll back)", snap, r.Memory, memory)
	}
	c.tag++
	return d, r, v.ping(fmt.Sprintf("rolled%d", c.tag))
}
