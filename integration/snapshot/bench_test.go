package snapshot

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cube-runtime/cube/hypervisor/control"
)

// The benchmarks run in the test host (nested KVM under TCG): absolute times are not hardware times, so every
// figure is set beside QEMU's (same kernel, same bench initramfs, same memory size, one vCPU each) and the
// ratios are what count. Each benchmark runs its own fixed number of iterations (benchRuns; use -benchtime=1x)
// and prints a table; the medians are also reported as metrics.

const benchRuns = 10

// benchInit is the bench guest's /init: fill bench.rand MiB of a tmpfs with random data (guest memory that is
// neither zero nor shared), say BENCH-READY, then serve console commands: "dirty N TAG" rewrites N MiB of
// another tmpfs file from the random one (N MiB of guest pages dirtied), "ping TAG" answers.
const benchInit = `#!/bin/busybox sh
/bin/busybox mount -t devtmpfs dev /dev 2>/dev/null
exec </dev/console >/dev/console 2>&1
/bin/busybox mkdir -p /proc /mem
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t tmpfs -o size=95% tmpfs /mem
mb=$(/bin/busybox sed -n 's/.*bench\.rand=\([0-9]*\).*/\1/p' /proc/cmdline)
/bin/busybox dd if=/dev/urandom of=/mem/rand bs=1M count=${mb:-0} 2>/dev/null
echo "BENCH-READY $(/bin/busybox ls -l /mem | /bin/busybox tr '\n' ' ')"
while read cmd n tag; do
  case "$cmd" in
  dirty) r=$(/bin/busybox dd if=/mem/rand of=/mem/dirty bs=1M count=$n conv=notrunc 2>&1 | /bin/busybox tail -1); echo "DIRTY-DONE $tag $r; rand $(/bin/busybox wc -c </mem/rand) bytes";;
  ping) echo "PONG $n";;
  esac
done
/bin/busybox sleep 1000000
`

const benchCmdline = "console=ttyS0 panic=-1 quiet"

// proc is a VMM process: console lines collected, stdin writable, killed with its group at the end.
type proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	mu    sync.Mutex
	lines []string
	errb  bytes.Buffer
	done  chan struct{}
}

func startProc(tb testing.TB, name string, args ...string) *proc {
	tb.Helper()
	p, err := startProcErr(name, args...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.kill)
	return p
}

// startProcErr is startProc without a testing.TB: the caller kills the process.
func startProcErr(name string, args ...string) (*proc, error) {
	return startProcEnv(nil, name, args...)
}

// startProcEnv is startProcErr with env added to the process's environment.
func startProcEnv(env []string, name string, args ...string) (*proc, error) {
	p := &proc{cmd: exec.Command(name, args...), done: make(chan struct{})}
	if env != nil {
		p.cmd.Env = append(os.Environ(), env...)
	}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.cmd.Stderr = &lockedBuf{mu: &p.mu, b: &p.errb}
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, strings.TrimRight(sc.Text(), "\r"))
			p.mu.Unlock()
		}
		p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

type lockedBuf struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (l *lockedBuf) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(b)
}

func (p *proc) kill() {
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

func (p *proc) tail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.lines[max(0, len(p.lines)-20):]
	return strings.Join(l, "\n") + "\nstderr:\n" + lastN(p.errb.String(), 2000)
}

func lastN(s string, n int) string { return s[max(0, len(s)-n):] }

// waitLine waits for a console line starting with prefix.
func (p *proc) waitLine(tb testing.TB, prefix string, timeout time.Duration) string {
	tb.Helper()
	l, err := p.waitLineErr(prefix, timeout)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

func (p *proc) wait(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		tb.Fatalf("%s did not exit:\n%s", p.cmd.Path, p.tail())
	}
}

// ---- cube-vmm ----

type cubeVM struct {
	p   *proc
	ctl *control.Client
}

func dialControl(tb testing.TB, p *proc, sock string, timeout time.Duration) *control.Client {
	tb.Helper()
	c, err := dialControlErr(p, sock, timeout)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// cubeArgs boots the bench initramfs in cube-vmm (it fills randMiB of tmpfs with random data and then serves
// console commands), with its control socket at sock.
func cubeArgs(sock string, memMiB, randMiB int) []string {
	return []string{"-kernel", guestKernel, "-initrd", benchInitrd, "-memory", fmt.Sprint(memMiB), "-vcpus", "1",
		"-cmdline", fmt.Sprintf("%s bench.rand=%d", benchCmdline, randMiB), "-console-input", "stdin", "-control", sock}
}

func bootCube(tb testing.TB, dir string, memMiB, randMiB int) *cubeVM {
	tb.Helper()
	sock := filepath.Join(dir, "cube-ctl.sock")
	p := startProc(tb, cubeVMM, cubeArgs(sock, memMiB, randMiB)...)
	tb.Logf("cube-vmm %d MiB guest: %s", memMiB, p.waitLine(tb, "BENCH-READY", 5*time.Minute))
	return &cubeVM{p: p, ctl: dialControl(tb, p, sock, time.Minute)}
}

func (v *cubeVM) stop(tb testing.TB) {
	v.ctl.Stop()
	v.ctl.Close()
	v.p.wait(tb, time.Minute)
}

type snapResult struct {
	FrozenMS      float64 `json:"frozen_ms"`
	TotalMS       float64 `json:"total_ms"`
	PrepareMS     float64 `json:"prepare_ms"`
	PrecopyMS     float64 `json:"precopy_ms"`
	MemoryBytes   int64   `json:"memory_bytes"`
	RecopiedBytes int64   `json:"recopied_bytes"`
	Memory        string  `json:"memory"` // rollback: rewrite-dirty or remap
	Pages         int64   `json:"pages_rewritten"`
}

func (v *cubeVM) snapshot(tb testing.TB, dir string, incremental bool) (time.Duration, snapResult) {
	tb.Helper()
	t0 := time.Now()
	raw, err := v.ctl.Snapshot(dir, incremental)
	d := time.Since(t0)
	if err != nil {
		tb.Fatalf("snapshot: %v\n%s", err, v.p.tail())
	}
	var r snapResult
	json.Unmarshal(raw, &r)
	return d, r
}

func (v *cubeVM) rollback(tb testing.TB, dir string) (time.Duration, snapResult) {
	tb.Helper()
	t0 := time.Now()
	raw, err := v.ctl.Rollback(dir)
	d := time.Since(t0)
	if err != nil {
		tb.Fatalf("rollback: %v\n%s", err, v.p.tail())
	}
	var r snapResult
	json.Unmarshal(raw, &r)
	return d, r
}

// restoreCube launches cube-vmm restore and returns the time from the launch to the control socket saying
// "running" (the socket appears once the vCPUs run); the VM is stopped again untimed.
func restoreCube(tb testing.TB, dir, snap string) time.Duration {
	tb.Helper()
	d, err := restoreCubeErr(dir, snap)
	if err != nil {
		tb.Fatal(err)
	}
	return d
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

// ---- QEMU ----

type qmp struct {
	c net.Conn
	r *bufio.Reader
}

func dialQMP(tb testing.TB, p *proc, sock string, timeout time.Duration) *qmp {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.Dial("unix", sock)
		if err == nil {
			q := &qmp{c: c, r: bufio.NewReader(c)}
			if _, err := q.r.ReadString('\n'); err != nil { // greeting
				tb.Fatalf("qmp greeting: %v", err)
			}
			q.do(tb, "qmp_capabilities", nil)
			return q
		}
		select {
		case <-p.done:
			tb.Fatalf("qemu exited: %v\n%s", err, p.tail())
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("qmp socket %s: %v\n%s", sock, err, p.tail())
		}
		time.Sleep(time.Millisecond)
	}
}

func (q *qmp) do(tb testing.TB, cmd string, args any) json.RawMessage {
	tb.Helper()
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	if _, err := q.c.Write(append(b, '\n')); err != nil {
		tb.Fatalf("qmp %s: %v", cmd, err)
	}
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			if cmd == "quit" {
				return nil
			}
			tb.Fatalf("qmp %s: %v", cmd, err)
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Desc string `json:"desc"`
			} `json:"error"`
			Event string `json:"event"`
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			tb.Fatalf("qmp %s: %q: %v", cmd, line, err)
		}
		if resp.Event != "" {
			continue
		}
		if resp.Error != nil {
			tb.Fatalf("qmp %s: %s", cmd, resp.Error.Desc)
		}
		return resp.Return
	}
}

func (q *qmp) status(tb testing.TB) string {
	var s struct {
		Status string `json:"status"`
	}
	json.Unmarshal(q.do(tb, "query-status", nil), &s)
	return s.Status
}

type qemuVM struct {
	p *proc
	q *qmp
}

func qemuArgs(sock string, memMiB, randMiB int) []string {
	return []string{"-enable-kvm", "-M", "pc", "-cpu", "host", "-smp", "1", "-m", fmt.Sprint(memMiB),
		"-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio",
		"-kernel", guestKernel, "-initrd", benchInitrd, "-append", fmt.Sprintf("%s bench.rand=%d", benchCmdline, randMiB),
		"-qmp", "unix:" + sock + ",server=on,wait=off"}
}

func bootQEMU(tb testing.TB, dir string, memMiB, randMiB int) *qemuVM {
	tb.Helper()
	sock := filepath.Join(dir, "qemu-qmp.sock")
	p := startProc(tb, "qemu-system-x86_64", qemuArgs(sock, memMiB, randMiB)...)
	q := dialQMP(tb, p, sock, time.Minute)
	p.waitLine(tb, "BENCH-READY", 5*time.Minute)
	// QEMU at its fastest: no migration bandwidth cap (the default is 128 MiB/s).
	q.do(tb, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40})
	return &qemuVM{p: p, q: q}
}

// save migrates the running VM to file and returns the time from the migrate command to "completed" and
// QEMU's own downtime figure (the VM stopped); the VM is then continued (untimed).
func (v *qemuVM) save(tb testing.TB, file string) (time.Duration, time.Duration) {
	tb.Helper()
	t0 := time.Now()
	v.q.do(tb, "migrate", map[string]any{"uri": "file:" + file})
	var downtime time.Duration
	for {
		var m struct {
			Status   string `json:"status"`
			Downtime int64  `json:"downtime"` // ms
		}
		json.Unmarshal(v.q.do(tb, "query-migrate", nil), &m)
		if m.Status == "completed" {
			downtime = time.Duration(m.Downtime) * time.Millisecond
			break
		}
		if m.Status == "failed" || m.Status == "cancelled" {
			tb.Fatalf("qemu migrate to %s: %s\n%s", file, m.Status, v.p.tail())
		}
		time.Sleep(time.Millisecond)
	}
	d := time.Since(t0)
	v.q.do(tb, "cont", nil)
	return d, downtime
}

func (v *qemuVM) stop(tb testing.TB) {
	v.q.do(tb, "quit", nil)
	v.p.wait(tb, time.Minute)
}

// loadQEMU launches QEMU with -incoming from file and returns the time from the launch to the VM running.
func loadQEMU(tb testing.TB, dir, file string, memMiB, randMiB int) time.Duration {
	tb.Helper()
	sock := filepath.Join(dir, "qemu-in.sock")
	t0 := time.Now()
	p := startProc(tb, "qemu-system-x86_64", append(qemuArgs(sock, memMiB, randMiB), "-incoming", "file:"+file)...)
	q := dialQMP(tb, p, sock, time.Minute)
	for q.status(tb) != "running" {
		time.Sleep(time.Millisecond)
	}
	d := time.Since(t0)
	(&qemuVM{p: p, q: q}).stop(tb)
	return d
}

// ---- figures ----

type series []time.Duration

func (s series) median() time.Duration {
	c := slices.Clone(s)
	slices.Sort(c)
	if len(c) == 0 {
		return 0
	}
	if len(c)%2 == 1 {
		return c[len(c)/2]
	}
	return (c[len(c)/2-1] + c[len(c)/2]) / 2
}

func (s series) String() string {
	c := slices.Clone(s)
	slices.Sort(c)
	return fmt.Sprintf("%8.1f ms (min %.1f, max %.1f, n=%d)", ms(s.median()), ms(c[0]), ms(c[len(c)-1]), len(c))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func ratio(a, b time.Duration) string { return fmt.Sprintf("%.3f×", float64(a)/float64(b)) }

func report(b *testing.B, format string, args ...any) {
	b.Helper()
	s := fmt.Sprintf(format, args...)
	fmt.Fprint(os.Stdout, s)
	b.Log(strings.TrimRight(s, "\n"))
}

func benchDir(b *testing.B) string {
	// /tmp in the test host is tmpfs: both VMMs write their snapshots to memory, as a host with fast storage would.
	d, err := os.MkdirTemp("", "snapbench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// BenchmarkVsQEMU: a 256 MiB guest with 64 MiB of random data; cube-vmm's snapshot, in-place rollback and
// restore in a new process beside QEMU's migrate to a file and -incoming from it.
func BenchmarkVsQEMU(b *testing.B) {
	const memMiB, randMiB = 256, 64
	dir := benchDir(b)
	for b.Loop() {
		// QEMU: save (migrate to file, the VM continues after each) and load (-incoming, launch to running).
		qv := bootQEMU(b, dir, memMiB, randMiB)
		var qsave, qdown, qload series
		for i := range benchRuns {
			f := filepath.Join(dir, fmt.Sprintf("qemu-%d.mig", i))
			d, down := qv.save(b, f)
			qsave, qdown = append(qsave, d), append(qdown, down)
			if i > 0 {
				os.Remove(f)
			}
		}
		qv.stop(b)
		qfile := filepath.Join(dir, "qemu-0.mig")
		fi, _ := os.Stat(qfile)
		for range benchRuns {
			qload = append(qload, loadQEMU(b, dir, qfile, memMiB, randMiB))
		}
		os.Remove(qfile)

		// cube-vmm: full snapshots of the running VM, rollbacks to the first, restores from it.
		cv := bootCube(b, dir, memMiB, randMiB)
		var csnap, cfrozen, cprecopy, croll, crollFrozen, crestore series
		var memBytes, recopied int64
		for i := range benchRuns {
			d, r := cv.snapshot(b, filepath.Join(dir, fmt.Sprintf("cube-%d", i)), false)
			csnap, cfrozen = append(csnap, d), append(cfrozen, time.Duration(r.FrozenMS*float64(time.Millisecond)))
			cprecopy = append(cprecopy, time.Duration(r.PrecopyMS*float64(time.Millisecond)))
			memBytes, recopied = r.MemoryBytes, r.RecopiedBytes
			if i > 0 {
				os.RemoveAll(filepath.Join(dir, fmt.Sprintf("cube-%d", i)))
			}
		}
		// Rollbacks. To the parent after the guest dirtied 16 MiB (only those pages are read back:
		// rewrite-dirty); then alternating between two snapshots, neither of them the parent (remap).
		snap, other := filepath.Join(dir, "cube-0"), filepath.Join(dir, "cube-1")
		if _, err := os.Stat(other); err != nil {
			cv.snapshot(b, other, false)
		}
		cv.rollback(b, snap) // makes cube-0 the parent
		var crollRemap series
		var rewritten int64
		for i := range benchRuns {
			fmt.Fprintf(cv.p.stdin, "dirty 16 r%d\n", i)
			cv.p.waitLine(b, fmt.Sprintf("DIRTY-DONE r%d ", i), 5*time.Minute)
			d, r := cv.rollback(b, snap)
			if r.Memory != "rewrite-dirty" {
				b.Fatalf("rollback to the parent: memory %q, want rewrite-dirty", r.Memory)
			}
			croll, crollFrozen, rewritten = append(croll, d), append(crollFrozen, time.Duration(r.FrozenMS*float64(time.Millisecond))), r.Pages
		}
		for i := range benchRuns {
			target := other
			if i%2 == 1 {
				target = snap
			}
			d, r := cv.rollback(b, target)
			if r.Memory != "remap" {
				b.Fatalf("rollback to a snapshot other than the parent: memory %q, want remap", r.Memory)
			}
			crollRemap = append(crollRemap, d)
		}
		os.RemoveAll(other)
		cv.p.stdin.Write([]byte("ping rolled\n"))
		cv.p.waitLine(b, "PONG rolled", time.Minute) // the rolled-back guest runs
		// Incremental snapshots of the idle guest, each over the previous one (a chain beside cube-0).
		var cinc series
		for i := range benchRuns {
			d, _ := cv.snapshot(b, filepath.Join(dir, fmt.Sprintf("cube-inc-%d", i)), true)
			cinc = append(cinc, d)
		}
		cv.stop(b)
		for i := range benchRuns {
			os.RemoveAll(filepath.Join(dir, fmt.Sprintf("cube-inc-%d", i)))
		}
		for range benchRuns {
			crestore = append(crestore, restoreCube(b, dir, snap))
		}
		var cstandby series
		for range benchRuns {
			cstandby = append(cstandby, restoreStandby(b, dir, snap))
		}
		_, restoreLog, err := restoreCubeErrLog(dir, snap, true)
		if err != nil {
			b.Fatal(err)
		}
		os.RemoveAll(snap)
		cubeNop, qemuNop := launchCost(b, cubeVMM, "restore"), launchCost(b, "qemu-system-x86_64", "-version")

		report(b, "\n256 MiB guest, 64 MiB random data, 1 vCPU, nested KVM in the test host; median of %d\n", benchRuns)
		report(b, "| operation | cube-vmm | QEMU | ratio (goal ≤ 0.1×) |\n|---|---|---|---|\n")
		report(b, "| snapshot (cube: control op; QEMU: migrate file: → completed) | %s | %s | %s |\n", csnap, qsave, ratio(csnap.median(), qsave.median()))
		report(b, "| snapshot, vCPUs frozen (cube: frozen_ms; QEMU: migration downtime) | %s | %s | %s |\n", cfrozen, qdown, ratio(cfrozen.median(), qdown.median()))
		report(b, "| snapshot, vCPUs frozen (vs QEMU save) | %s | %s | %s |\n", cfrozen, qsave, ratio(cfrozen.median(), qsave.median()))
		report(b, "| incremental snapshot of the idle guest (vs QEMU save) | %s | %s | %s |\n", cinc, qsave, ratio(cinc.median(), qsave.median()))
		report(b, "| rollback in place to the parent, 16 MiB dirtied since (cube: rewrite-dirty; vs QEMU load) | %s | %s | %s |\n", croll, qload, ratio(croll.median(), qload.median()))
		report(b, "| rollback in place to another snapshot (cube: remap; vs QEMU load) | %s | %s | %s |\n", crollRemap, qload, ratio(crollRemap.median(), qload.median()))
		report(b, "| restore, launch → running (QEMU: -incoming file:) | %s | %s | %s |\n", crestore, qload, ratio(crestore.median(), qload.median()))
		report(b, "| restore into a standby cube-vmm, restore op → running (vs QEMU launch → running) | %s | %s | %s |\n", cstandby, qload, ratio(cstandby.median(), qload.median()))
		report(b, "cube snapshot: pre-copy (running) %s, vCPUs frozen %s, memory written %d MiB of which %.1f MiB again while frozen; rollback to the parent: frozen %s, %d pages rewritten; QEMU file %d MiB\n",
			cprecopy, cfrozen, memBytes>>20, float64(recopied)/(1<<20), crollFrozen, rewritten, fi.Size()>>20)
		report(b, "process launch alone (exec → exit, no VM): cube-vmm %s, QEMU %s\n", cubeNop, qemuNop)
		report(b, "one restore with cube-vmm's log (took = since its flags were parsed; steps in ms):\n  %s\n", strings.ReplaceAll(restoreLog, "\n", "\n  "))
		b.ReportMetric(ms(csnap.median()), "cube-snapshot-ms")
		b.ReportMetric(ms(cfrozen.median()), "cube-snapshot-frozen-ms")
		b.ReportMetric(ms(qsave.median()), "qemu-save-ms")
		b.ReportMetric(ms(qdown.median()), "qemu-save-downtime-ms")
		b.ReportMetric(ms(croll.median()), "cube-rollback-ms")
		b.ReportMetric(ms(crollRemap.median()), "cube-rollback-remap-ms")
		b.ReportMetric(ms(crestore.median()), "cube-restore-ms")
		b.ReportMetric(ms(cstandby.median()), "cube-restore-standby-ms")
		b.ReportMetric(ms(qload.median()), "qemu-load-ms")
	}
}
