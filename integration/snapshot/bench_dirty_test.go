package snapshot

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-runtime/cube/hypervisor/control"
)

// dirtyRuns is BenchmarkSnapshotDirty's cycles per dirty size. Fewer than benchRuns: each cycle also writes an
// untimed full snapshot of up to 1 GiB of guest memory, and the nested guests of the test host are fragile.
const dirtyRuns = 5

// dirtyMaxBoots bounds the VMs one dirty size may use: a VM that dies (the nested guest stalls, cube-vmm exits
// 10: README "Known problems") is replaced by a fresh one, and the cycles it finished still count.
const dirtyMaxBoots = 3

// BenchmarkSnapshotDirty: incremental snapshot latency against the MiB the guest dirtied since its parent, in
// a 1 GiB guest (and 16 MiB in a 128 MiB guest): sub-benchmark dirty; restore latency of a 128 MiB and a 1 GiB
// guest: sub-benchmark restore (-bench BenchmarkSnapshotDirty/restore runs it alone).
func BenchmarkSnapshotDirty(b *testing.B) {
	b.Run("dirty", benchDirty)
	b.Run("restore", benchRestoreSize)
}

// failures counts the VMs a benchmark lost (left out of its medians) and prints each with its evidence.
type failures []string

func (f *failures) add(b *testing.B, what string, err error) {
	*f = append(*f, fmt.Sprintf("%s: %v", what, firstLine(err.Error())))
	report(b, "FAILED %s: %v\n", what, err)
}

func (f failures) report(b *testing.B) {
	report(b, "failures (left out of the medians): %d\n", len(f))
	for _, s := range f {
		report(b, "  %s\n", s)
	}
}

// benchDirty: each cycle is a full snapshot (untimed; it is the parent, and the VM's dirty record starts empty
// after it) → the guest rewrites n MiB of its tmpfs → the timed incremental snapshot over the parent. No
// in-place rollback (docs/snapshot.md). Every dirty size gets a freshly booted VM, so no VM runs more than
// dirtyRuns cycles: the 1 GiB guest died after 20-25 cycles in one VM in earlier runs. Each figure is printed
// as it comes, so a run that dies half-way (the test host's kernel) still leaves them.
func benchDirty(b *testing.B) {
	dir := benchDir(b)
	guests := []struct {
		mem, rand int
		sizes     []int
	}{{128, 32, []int{16}}, {1024, 256, []int{1, 16, 64, 256}}}
	for b.Loop() {
		type key struct{ mem, n int }
		snaps := map[key]series{}
		frozen := map[key]series{}
		written := map[key]int64{}
		var failed failures
		tag := 0
		for _, g := range guests {
			for _, n := range g.sizes {
				k := key{g.mem, n}
				for boot := 1; len(snaps[k]) < dirtyRuns; boot++ {
					if boot > dirtyMaxBoots {
						report(b, "%d MiB guest, %d MiB dirtied: giving up after %d VMs\n", g.mem, n, dirtyMaxBoots)
						break
					}
					report(b, "boot %d MiB guest (%d MiB random) for %d MiB dirtied, VM %d; test host: %s\n", g.mem, g.rand, n, boot, memAvailable())
					v, err := bootCubeErr(dir, g.mem, g.rand)
					if err != nil {
						failed.add(b, fmt.Sprintf("boot %d MiB guest", g.mem), err)
						continue
					}
					for len(snaps[k]) < dirtyRuns {
						tag++
						d, r, err := v.dirtyCycle(dir, n, tag)
						if err != nil {
							failed.add(b, fmt.Sprintf("cycle %d (%d MiB guest, %d MiB dirtied)", tag, g.mem, n), err)
							break
						}
						snaps[k] = append(snaps[k], d)
						frozen[k] = append(frozen[k], time.Duration(r.FrozenMS*float64(time.Millisecond)))
						written[k] = r.MemoryBytes
						report(b, "cycle %d: %d MiB guest, %d MiB dirtied: incremental snapshot %.1f ms (frozen %.1f ms), %.1f MiB written\n",
							tag, g.mem, n, ms(d), r.FrozenMS, float64(r.MemoryBytes)/(1<<20))
					}
					if len(snaps[k]) < dirtyRuns {
						v.abandon()
						continue
					}
					if err := v.stopErr(); err != nil {
						failed.add(b, fmt.Sprintf("stop %d MiB guest", g.mem), err)
					}
				}
			}
		}
		report(b, "\ncube-vmm incremental snapshot latency vs memory dirtied since the parent (1 vCPU, median of %d)\n", dirtyRuns)
		report(b, "| guest | dirtied | incremental snapshot | vCPUs frozen | memory written | vs 1 MiB |\n|---|---|---|---|---|---|\n")
		for _, g := range guests {
			for _, n := range g.sizes {
				k := key{g.mem, n}
				report(b, "| %d MiB | %d MiB | %s | %s | %.1f MiB | %s |\n", g.mem, n, snaps[k], frozen[k],
					float64(written[k])/(1<<20), ratio(snaps[k].median(), snaps[key{1024, 1}].median()))
			}
		}
		report(b, "1 GiB / 128 MiB guest at 16 MiB dirtied: %s (goal ≤ 2×)\n", ratio(snaps[key{1024, 16}].median(), snaps[key{128, 16}].median()))
		failed.report(b)
		b.ReportMetric(ms(snaps[key{1024, 16}].median()), "snap-1G-16M-ms")
		b.ReportMetric(ms(snaps[key{128, 16}].median()), "snap-128M-16M-ms")
	}
}

// benchRestoreSize: cube-vmm restore (launch → running) of a 128 MiB guest with 32 MiB of random data and of a
// 1 GiB guest with 256 MiB, each from a full snapshot taken just after its boot; then one more restore of each
// with cube-vmm's step log, and cube-vmm's package init cost.
func benchRestoreSize(b *testing.B) {
	dir := benchDir(b)
	guests := []struct{ mem, rand int }{{128, 32}, {1024, 256}}
	for b.Loop() {
		restores, standbys := map[int]series{}, map[int]series{}
		var failed failures
		var logs []string
		for _, g := range guests {
			snap := filepath.Join(dir, fmt.Sprintf("restore-%d", g.mem))
			for boot := 1; ; boot++ {
				if boot > dirtyMaxBoots {
					report(b, "%d MiB guest: no snapshot after %d VMs\n", g.mem, dirtyMaxBoots)
					break
				}
				v, err := bootCubeErr(dir, g.mem, g.rand)
				if err != nil {
					failed.add(b, fmt.Sprintf("boot %d MiB guest", g.mem), err)
					continue
				}
				_, _, err = v.snapshotErr(snap, false)
				if err != nil {
					failed.add(b, fmt.Sprintf("full snapshot of the %d MiB guest", g.mem), err)
					v.abandon()
					continue
				}
				if err := v.stopErr(); err != nil {
					failed.add(b, fmt.Sprintf("stop %d MiB guest", g.mem), err)
				}
				break
			}
			for i := 0; i < benchRuns+dirtyMaxBoots && len(restores[g.mem]) < benchRuns; i++ {
				d, err := restoreCubeErr(dir, snap)
				if err != nil {
					failed.add(b, fmt.Sprintf("restore %d of the %d MiB guest", i+1, g.mem), err)
					continue
				}
				restores[g.mem] = append(restores[g.mem], d)
				report(b, "restore %d: %d MiB guest, launch → running %.1f ms\n", i+1, g.mem, ms(d))
			}
			for range benchRuns {
				standbys[g.mem] = append(standbys[g.mem], restoreStandby(b, dir, snap))
			}
			report(b, "standby restores, %d MiB guest: %s\n", g.mem, standbys[g.mem])
			// One more, logged (not in the medians): where a restore's time goes, by cube-vmm's own clock.
			if d, log, err := restoreCubeErrLog(dir, snap, true); err == nil {
				logs = append(logs, fmt.Sprintf("%d MiB guest: launch → running %.1f ms\n  %s", g.mem, ms(d), strings.ReplaceAll(log, "\n", "\n  ")))
				report(b, "%s\n", logs[len(logs)-1])
			} else {
				failed.add(b, fmt.Sprintf("logged restore of the %d MiB guest", g.mem), err)
			}
			os.RemoveAll(snap)
		}
		report(b, "\ncube-vmm restore, launch → running, and into a standby cube-vmm, restore op → running (1 vCPU, median of %d)\n| guest | restore | standby restore |\n|---|---|---|\n", benchRuns)
		report(b, "| 128 MiB (32 MiB random) | %s | %s |\n| 1 GiB (256 MiB random) | %s | %s |\n", restores[128], standbys[128], restores[1024], standbys[1024])
		report(b, "1 GiB / 128 MiB restore: %s, standby restore: %s (goal: flat)\n", ratio(restores[1024].median(), restores[128].median()),
			ratio(standbys[1024].median(), standbys[128].median()))
		report(b, "one more restore each with cube-vmm's log (took = since its flags were parsed; steps in ms):\n%s\n", strings.Join(logs, "\n"))
		report(b, "cube-vmm process start (GODEBUG=inittrace=1): %s\n", initCost())
		failed.report(b)
		b.ReportMetric(ms(restores[1024].median()), "restore-1G-ms")
		b.ReportMetric(ms(restores[128].median()), "restore-128M-ms")
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// dirtyCycle: a full snapshot as the parent (untimed), the guest dirties n MiB, the timed incremental snapshot
// over the parent. Both snapshots are removed after.
func (v *cubeVM) dirtyCycle(dir string, n, tag int) (time.Duration, snapResult, error) {
	base, inc := filepath.Join(dir, "base"), filepath.Join(dir, "inc") // inc must be beside its parent
	defer os.RemoveAll(base)
	defer os.RemoveAll(inc)
	if _, _, err := v.snapshotErr(base, false); err != nil {
		return 0, snapResult{}, fmt.Errorf("full snapshot (parent): %w", err)
	}
	fmt.Fprintf(v.p.stdin, "dirty %d t%d\n", n, tag)
	line, err := v.p.waitLineErr(fmt.Sprintf("DIRTY-DONE t%d ", tag), 3*time.Minute)
	if err != nil {
		return 0, snapResult{}, fmt.Errorf("dirty %d MiB: %w", n, err)
	}
	// The guest's own word that it copied n MiB (dd's last line: bytes copied, or records out), so a cycle
	// that dirtied nothing shows.
	if !strings.Contains(line, fmt.Sprintf("%d bytes", n<<20)) && !strings.Contains(line, fmt.Sprintf("%d+0 records out", n)) {
		return 0, snapResult{}, fmt.Errorf("dirty %d MiB: the guest says %q", n, line)
	}
	d, r, err := v.snapshotErr(inc, true)
	if err != nil {
		return 0, snapResult{}, fmt.Errorf("incremental snapshot: %w", err)
	}
	return d, r, nil
}

// opTimeout bounds one control op: a VMM whose vCPU is stuck never answers, and the benchmark must go on.
const opTimeout = 3 * time.Minute

// ctlDo runs a control op with opTimeout; a failure carries the evidence.
func (v *cubeVM) ctlDo(what string, f func() error) error {
	if err := within(opTimeout, f); err != nil {
		return fmt.Errorf("%s: %w\n%s", what, err, v.evidence())
	}
	return nil
}

// within runs f for at most timeout (f goes on in the background after it).
func within(timeout time.Duration, f func() error) error {
	c := make(chan error, 1)
	go func() { c <- f() }()
	select {
	case err := <-c:
		return err
	case <-time.After(timeout):
		return fmt.Errorf("no answer in %v", timeout)
	}
}

func (v *cubeVM) snapshotErr(dir string, incremental bool) (time.Duration, snapResult, error) {
	var raw json.RawMessage
	t0 := time.Now()
	var d time.Duration
	err := v.ctlDo("snapshot "+dir, func() error {
		var err error
		raw, err = v.ctl.Snapshot(dir, incremental)
		d = time.Since(t0)
		return err
	})
	if err != nil {
		return 0, snapResult{}, err
	}
	var r snapResult
	if err := json.Unmarshal(raw, &r); err != nil {
		return 0, snapResult{}, fmt.Errorf("snapshot %s: result %q: %w", dir, raw, err)
	}
	return d, r, nil
}

// stopErr stops the VM through its control socket; a VM that does not stop is abandoned. A stop whose reply
// is lost (EOF: cube-vmm can close the connection as it exits, before the reply is written) but whose VMM
// exits counts as stopped.
func (v *cubeVM) stopErr() error {
	err := v.ctlDo("stop", v.ctl.Stop)
	if err == nil || errors.Is(err, io.EOF) {
		err = v.p.waitExit(time.Minute)
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
	if !v.p.exited() && within(20*time.Second, v.ctl.Pause) == nil && within(20*time.Second, v.ctl.Stop) == nil {
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

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) waitExit(timeout time.Duration) error {
	select {
	case <-p.done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("%s did not exit in %v", p.cmd.Path, timeout)
	}
}

// waitLineErr is waitLine returning an error (with the evidence) instead of failing the benchmark.
func (p *proc) waitLineErr(prefix string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	seen := 0
	for {
		p.mu.Lock()
		for ; seen < len(p.lines); seen++ {
			if l := p.lines[seen]; strings.HasPrefix(l, prefix) {
				p.mu.Unlock()
				return l, nil
			}
		}
		p.mu.Unlock()
		if p.exited() {
			return "", fmt.Errorf("%s exited (%v) before %q:\n%s\ntest host kernel log:\n%s", p.cmd.Path, p.cmd.ProcessState, prefix, p.tail(), bounded(kernelLog))
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no %q from %s in %v:\n%s\nthreads:\n%s\ntest host kernel log:\n%s", prefix, p.cmd.Path, timeout, p.tail(),
				bounded(func() string { return threadStacks(p.cmd.Process.Pid) }), bounded(kernelLog))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// bootCubeErr is bootCube returning an error instead of failing the benchmark (a nested boot may stall).
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
		c, err := control.Dial(sock)
		if err == nil {
			return c, nil
		}
		if p.exited() {
			return nil, fmt.Errorf("cube-vmm exited (%v): %w\n%s", p.cmd.ProcessState, err, p.tail())
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("control socket %s: %w\n%s", sock, err, p.tail())
		}
		time.Sleep(time.Millisecond)
	}
}

// restoreCubeErr is restoreCube returning an error: the time from launching cube-vmm restore to its control
// socket reporting "running"; the VM is then stopped (untimed).
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
		if err := v.ctlDo("info", func() error { return ctl.Info(&info) }); err != nil {
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

// initCost runs cube-vmm with nothing to do (a usage error) under GODEBUG=inittrace=1 and sums its package
// initializers' clock time, naming the costliest: part of the process start that every restore pays.
func initCost() string {
	cmd := exec.Command(cubeVMM, "restore")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	t0 := time.Now()
	cmd.Run() // a usage error is the point
	wall := time.Since(t0)
	type pkg struct {
		name string
		ms   float64
	}
	var pkgs []pkg
	var total float64
	for _, l := range strings.Split(stderr.String(), "\n") {
		// init github.com/x/y @1.2 ms, 0.35 ms clock, 1234 bytes, 5 allocs
		var name string
		var at, clock float64
		if n, _ := fmt.Sscanf(l, "init %s @%f ms, %f ms clock", &name, &at, &clock); n == 3 {
			pkgs = append(pkgs, pkg{name, clock})
			total += clock
		}
	}
	slices.SortFunc(pkgs, func(a, b pkg) int { return cmp.Compare(b.ms, a.ms) })
	var top []string
	for _, p := range pkgs[:min(8, len(pkgs))] {
		top = append(top, fmt.Sprintf("%s %.2f", p.name, p.ms))
	}
	return fmt.Sprintf("exec → exit %.1f ms; %d package inits, %.1f ms in all; costliest (ms): %s", ms(wall), len(pkgs), total, strings.Join(top, ", "))
}

// memAvailable is the test host's MemAvailable and Shmem (tmpfs: the snapshots) from /proc/meminfo.
func memAvailable() string {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "MemAvailable:") || strings.HasPrefix(l, "Shmem:") {
			out = append(out, strings.Join(strings.Fields(l), " "))
		}
	}
	return strings.Join(out, ", ")
}

// bounded runs f for at most 10 s (a /proc read of a process stuck in the kernel may block).
func bounded(f func() string) string {
	c := make(chan string, 1)
	go func() { c <- f() }()
	select {
	case s := <-c:
		return s
	case <-time.After(10 * time.Second):
		return "(blocked for 10 s)"
	}
}

// threadStacks describes each thread of pid: state, kernel wait channel and kernel stack.
func threadStacks(pid int) string {
	var b strings.Builder
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return err.Error()
	}
	for _, t := range tasks {
		stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
		wchan, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/wchan", pid, t.Name()))
		stack, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stack", pid, t.Name()))
		state := "?"
		if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) {
			state = string(stat[i+2])
		}
		fmt.Fprintf(&b, "thread %s state %s wchan %s\n%s", t.Name(), state, wchan, stack)
	}
	return b.String()
}

// kernelLog returns the test host kernel's messages about KVM, the OOM killer and faults.
func kernelLog() string {
	// Raw syscalls: an os.File would hand the non-blocking descriptor to the Go poller, whose Read waits for
	// the next record instead of returning EAGAIN at the end of the log.
	fd, err := syscall.Open("/dev/kmsg", syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Sprintf("(kernel log: %v)", err)
	}
	defer syscall.Close(fd)
	var out []string
	buf := make([]byte, 8192)
	for {
		n, err := syscall.Read(fd, buf)
		if errors.Is(err, syscall.EPIPE) {
			continue // records were overwritten while reading
		}
		if err != nil || n <= 0 {
			break
		}
		l := string(buf[:n])
		if i := strings.IndexByte(l, ';'); i >= 0 {
			l = l[i+1:]
		}
		for _, w := range []string{"kvm", "oom", "Out of memory", "Killed process", "segfault", "BUG", "WARNING", "Call Trace"} {
			if strings.Contains(l, w) {
				out = append(out, strings.TrimSpace(l))
				break
			}
		}
	}
	return lastN(strings.Join(out, "\n"), 4000)
}
