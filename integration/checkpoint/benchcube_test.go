package checkpoint

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/cubetest"
)

// BenchmarkCube is issue 14's benchmarks, side by side in one test host run
// (run with -benchtime 1x: each part takes its own samples; the tables are
// printed, nothing is asserted on times):
//   - rollback through the shim service (`cube rollback`: CLI wall, shim
//     total) vs the cube-vmm op alone (the Rollback reply's vmm figures);
//   - `ctr containers restore --live` vs a cold `ctr run -d` (templates off)
//     vs `ctr run -d` from the automatic template;
//   - `cube fork -n N` for N = 1, 4, 8 (wall, per clone) vs N `cube
//     restore`s of one snapshot, and the host memory per clone (PSS of the
//     clones' cube-vmm, smaps_rollup) vs a cold-booted sandbox's.
//
// A fork that does not fit the test host (memory) is reported as such and
// the larger ones are skipped.
func BenchmarkCube(b *testing.B) {
	d := startDaemons(b)
	for b.Loop() {
		var out strings.Builder
		src, coldPSS := d.benchColdRun(b, &out)
		srcRemoved := false
		b.Cleanup(func() {
			if !srcRemoved {
				d.Remove(b, src)
			}
		})
		d.benchRestore(b, &out, src)
		d.benchRollback(b, &out, src)
		d.benchFork(b, &out, src, coldPSS)
		// Ordering: the source holds the snapshot it rolled back to until it is gone.
		d.Remove(b, src)
		srcRemoved = true
		for _, ref := range []string{"bench-rb", "bench-fork"} {
			if o, rc := d.Cube(b, "snapshots", "rm", ref); rc != 0 {
				b.Errorf("rm %s at the end: rc %d\n%s", ref, rc, o)
			}
		}
		b.Log("\n" + out.String())
	}
}

const benchRollbackRounds = 3

// benchColdRun cold-boots two sandboxes with `ctr run -d` and templates off (the first stays: the source of
// the other parts), then starts two from the automatic template (the default configuration, after an
// untimed probe run that makes the template if no earlier run did), prints their times, and returns the
// source's id and a cold-booted sandbox's cube-vmm PSS (KiB).
func (d *daemons) benchColdRun(b *testing.B, out *strings.Builder) (string, int64) {
	cold, pss, src := d.benchRuns(b, "bench-cold", d.ColdRuntime(b), true)
	probe := append(append([]string{"run", "--rm"}, cubetest.CubeRuntime.Args...), cubetest.ImageRef, "bench-probe", "true")
	if o, rc, err := d.CtrQuiet(nil, probe...); err != nil || rc != 0 {
		b.Fatalf("template probe run: rc %d %v\n%s", rc, err, o)
	}
	from := d.LogSize()
	tmpl, tmplPSS, _ := d.benchRuns(b, "bench-tmpl", cubetest.CubeRuntime.Args, false)
	if log := d.LogFrom(from); strings.Count(log, cubetest.LogRestoring) < len(tmpl) {
		b.Fatalf("the template runs were not restored from a template; shim log:\n%s", cubetest.GrepLines(log, "template"))
	}
	fmt.Fprintf(out, "\n### cold `ctr run -d` vs from a template vs `ctr containers restore --live` (wall of the ctr command)\n\n")
	if m := cubetest.Median(tmpl); m > 0 {
		fmt.Fprintf(out, "cold / template: %.2fx; cube-vmm PSS cold %d KiB, from the template %d KiB\n\n",
			float64(cubetest.Median(cold))/float64(m), pss, tmplPSS)
	}
	fmt.Fprintf(out, "| op | samples | median | min | max |\n|---|---|---|---|---|\n")
	fmt.Fprintf(out, "| cold `ctr run -d` (templates off: boot + start) | %d | %v | %v | %v |\n", len(cold), ms(cubetest.Median(cold)), ms(minDur(cold)), ms(maxDur(cold)))
	fmt.Fprintf(out, "| `ctr run -d` from the automatic template (restore + start) | %d | %v | %v | %v |\n", len(tmpl), ms(cubetest.Median(tmpl)), ms(minDur(tmpl)), ms(maxDur(tmpl)))
	return src, pss
}

// benchRuns starts two sandboxes `ctr run -d` with the runtime flags args, each counting; it removes them
// (but the first when keepFirst) and returns their times, the second's settled cube-vmm PSS (KiB) and the
// first's id.
func (d *daemons) benchRuns(b *testing.B, prefix string, args []string, keepFirst bool) ([]time.Duration, int64, string) {
	var times []time.Duration
	var pss int64
	first := ""
	for i := range 2 {
		id := fmt.Sprintf("%s%d", prefix, i)
		cargs := append(append([]string{"run", "-d"}, args...), cubetest.ImageRef, id, "sh", "-c", cubetest.CounterScript)
		start := time.Now()
		o, rc, err := d.CtrQuiet(nil, cargs...)
		if err != nil || rc != 0 {
			b.Fatalf("ctr run -d %s: rc %d %v\n%s", id, rc, err, o)
		}
		times = append(times, time.Since(start))
		tk := d.WaitStatus(b, id, "RUNNING", time.Minute)
		d.CounterAbove(b, id, 0)
		if i == 0 {
			first = id
			if keepFirst {
				continue
			}
		} else {
			time.Sleep(2 * time.Second) // settled: booted, the counter running
			pss = pssKiB(b, tk.PID)
		}
		d.Remove(b, id)
	}
	return times, pss, first
}

// benchRestore checkpoints src (`ctr containers checkpoint --task`) and
// restores it twice under new ids, timing `ctr containers restore --live`.
func (d *daemons) benchRestore(b *testing.B, out *strings.Builder, src string) {
	const ref = "docker.io/e2e/bench-checkpoint:1"
	start := time.Now()
	if o, rc, err := d.CtrQuiet(nil, "containers", "checkpoint", "--task", "--rw", src, ref); err != nil || rc != 0 {
		b.Fatalf("ctr containers checkpoint --task: rc %d %v\n%s", rc, err, o)
	}
	ckpt := time.Since(start)
	b.Cleanup(func() { d.CtrQuiet(nil, "images", "rm", "--sync", ref) })
	d.WaitStatus(b, src, "RUNNING", 10*time.Second)
	var times []time.Duration
	for i := range 2 {
		id := fmt.Sprintf("bench-restored%d", i)
		start := time.Now()
		o, rc, err := d.CtrQuiet(nil, "containers", "restore", "--live", "--rw", id, ref)
		if err != nil || rc != 0 {
			b.Fatalf("ctr containers restore --live %s: rc %d %v\n%s", id, rc, err, o)
		}
		times = append(times, time.Since(start))
		d.WaitStatus(b, id, "RUNNING", time.Minute)
		d.CounterAbove(b, id, 0)
		d.Remove(b, id)
	}
	fmt.Fprintf(out, "| `ctr containers restore --live --rw` (restore + start) | %d | %v | %v | %v |\n", len(times), ms(cubetest.Median(times)), ms(minDur(times)), ms(maxDur(times)))
	fmt.Fprintf(out, "\n(`ctr containers checkpoint --task --rw` took %v)\n", ms(ckpt))
}

// rolledBackJSON is the part of `cube rollback --json` (the shim's Rollback
// reply) the benchmark reads.
type rolledBackJSON struct {
	Memory  string `json:"memory"`
	Timings struct {
		VMMPrepareMS float64 `json:"vmm_prepare_ms"`
		VMMFrozenMS  float64 `json:"vmm_frozen_ms"`
		VMMTotalMS   float64 `json:"vmm_total_ms"`
		ReconnectMS  float64 `json:"reconnect_ms"`
		ReconcileMS  float64 `json:"reconcile_ms"`
		ShimTotalMS  float64 `json:"shim_total_ms"`
	} `json:"timings"`
}

// benchRollback takes one snapshot of src and rolls back to it
// benchRollbackRounds times: the CLI's wall, the shim's total and the
// cube-vmm op's own figures, each round's median.
func (d *daemons) benchRollback(b *testing.B, out *strings.Builder, src string) {
	d.CubeJSON(b, "snapshot", src, "--name", "bench-rb", "--json")
	var wall, shim, vmm, prep, frozen, reconn, recon []time.Duration
	mem := map[string]int{}
	for range benchRollbackRounds {
		d.CounterAbove(b, src, 0)
		start := time.Now()
		o, e, rc := d.CubeRun(b, "rollback", src, "bench-rb", "--json")
		took := time.Since(start)
		var rb rolledBackJSON
		if rc != 0 || json.Unmarshal([]byte(o), &rb) != nil {
			b.Fatalf("cube rollback --json: rc %d\n%s%s", rc, o, e)
		}
		wall = append(wall, took)
		tm := rb.Timings
		for _, p := range []struct {
			to *[]time.Duration
			v  float64
		}{{&shim, tm.ShimTotalMS}, {&vmm, tm.VMMTotalMS}, {&prep, tm.VMMPrepareMS}, {&frozen, tm.VMMFrozenMS},
			{&reconn, tm.ReconnectMS}, {&recon, tm.ReconcileMS}} {
			*p.to = append(*p.to, time.Duration(p.v*float64(time.Millisecond)))
		}
		mem[rb.Memory]++
	}
	fmt.Fprintf(out, "\n### rollback in place to the VM's parent snapshot (%d rounds, medians; memory %v)\n\n", benchRollbackRounds, mem)
	fmt.Fprintf(out, "| measure | median | vs the cube-vmm op |\n|---|---|---|\n")
	v := cubetest.Median(vmm)
	row := func(name string, ds []time.Duration) {
		r := ""
		if v > 0 {
			r = fmt.Sprintf("%.2fx", float64(cubetest.Median(ds))/float64(v))
		}
		fmt.Fprintf(out, "| %s | %v | %s |\n", name, ms(cubetest.Median(ds)), r)
	}
	row("`cube rollback` wall (CLI process, containerd lookup, store, shim)", wall)
	row("shim Rollback RPC total", shim)
	row("cube-vmm rollback op (prepare + frozen)", vmm)
	row("  of it prepare (outside the freeze)", prep)
	row("  of it frozen (vCPUs stopped)", frozen)
	row("shim: agent reconnect", reconn)
	row("shim: process reconcile", recon)
	fmt.Fprintf(out, "\nservice overhead (shim total - cube-vmm op): %v; CLI overhead (wall - shim total): %v\n",
		ms(cubetest.Median(shim)-v), ms(cubetest.Median(wall)-cubetest.Median(shim)))
}

// benchFork forks src into 1, 4 and 8 clones and restores the same number
// from one snapshot with `cube restore`, with each clone's cube-vmm PSS.
func (d *daemons) benchFork(b *testing.B, out *strings.Builder, src string, coldPSS int64) {
	fmt.Fprintf(out, "\n### fork vs separate restores, host memory per clone (PSS of cube-vmm, smaps_rollup)\n\n")
	fmt.Fprintf(out, "cold-booted sandbox (`ctr run -d`, settled): cube-vmm PSS %.1f MiB\n\n", float64(coldPSS)/1024)
	fmt.Fprintf(out, "| N | op | wall | per clone | PSS per clone | PSS per clone vs cold |\n|---|---|---|---|---|---|\n")
	snap := d.CubeJSON(b, "snapshot", src, "--name", "bench-fork", "--json")
	for _, n := range []int{1, 4, 8} {
		forkRow, ok := d.benchForkN(b, src, n, coldPSS)
		fmt.Fprint(out, forkRow)
		if !ok {
			fmt.Fprintf(out, "| %d | (larger forks skipped: %d clones did not fit this test host) | | | | |\n", n, n)
			break
		}
		restRow, ok := d.benchRestoreN(b, n, coldPSS)
		fmt.Fprint(out, restRow)
		if !ok {
			break
		}
	}
	if snap.VM != nil {
		fmt.Fprintf(out, "\n(the separate restores map one `cube snapshot`, taken beforehand in %.1f ms, frozen %.1f ms; a fork takes its own inside its wall)\n", snap.VM.TotalMS, snap.VM.FrozenMS)
	}
}

// benchForkN is `cube fork src -n n` and its row; ok is false when the fork
// failed (the row says why).
func (d *daemons) benchForkN(b *testing.B, src string, n int, coldPSS int64) (string, bool) {
	prefix := fmt.Sprintf("bench-f%d", n)
	start := time.Now()
	o, e, rc := d.CubeRun(b, "fork", src, "-n", strconv.Itoa(n), "--prefix", prefix, "--all-or-nothing", "--json")
	took := time.Since(start)
	var f forked
	if rc != 0 || json.Unmarshal([]byte(o), &f) != nil || len(f.Clones) != n {
		why := cubetest.FirstLine(strings.TrimSpace(e + o))
		return fmt.Sprintf("| %d | `cube fork -n %d` failed: %s | | | | |\n", n, n, why), false
	}
	var ids []string
	for _, c := range f.Clones {
		ids = append(ids, c.ID)
	}
	pss := d.settledPSS(b, ids)
	for _, id := range ids {
		d.Remove(b, id)
	}
	return memRow(n, fmt.Sprintf("`cube fork -n %d`", n), took, pss, coldPSS), true
}

// benchRestoreN is n `cube restore`s of bench-fork, one after another, and
// its row.
func (d *daemons) benchRestoreN(b *testing.B, n int, coldPSS int64) (string, bool) {
	var ids []string
	defer func() {
		for _, id := range ids {
			d.Remove(b, id)
		}
	}()
	start := time.Now()
	for i := range n {
		id := fmt.Sprintf("bench-r%d-%d", n, i+1)
		if o, e, rc := d.CubeRun(b, "restore", "bench-fork", id, "--quiet"); rc != 0 {
			d.Forget(id)
			return fmt.Sprintf("| %d | restore %d of %d failed: %s | | | | |\n", n, i+1, n, cubetest.FirstLine(strings.TrimSpace(e+o))), false
		}
		ids = append(ids, id)
	}
	took := time.Since(start)
	return memRow(n, fmt.Sprintf("%d × `cube restore`", n), took, d.settledPSS(b, ids), coldPSS), true
}

// settledPSS waits until every sandbox in ids counts again and returns
// their cube-vmm processes' PSS (KiB).
func (d *daemons) settledPSS(b *testing.B, ids []string) []int64 {
	for _, id := range ids {
		d.WaitStatus(b, id, "RUNNING", time.Minute)
		d.CounterAbove(b, id, 0)
	}
	time.Sleep(2 * time.Second)
	tasks := d.Tasks(b)
	var pss []int64
	for _, id := range ids {
		pss = append(pss, pssKiB(b, tasks[id].PID))
	}
	return pss
}

func memRow(n int, op string, took time.Duration, pss []int64, coldPSS int64) string {
	var sum int64
	for _, p := range pss {
		sum += p
	}
	per := float64(sum) / float64(len(pss)) / 1024
	ratio := ""
	if coldPSS > 0 {
		ratio = fmt.Sprintf("%.2fx", per*1024/float64(coldPSS))
	}
	return fmt.Sprintf("| %d | %s | %v | %v | %.1f MiB | %s |\n", n, op, ms(took), ms(took/time.Duration(n)), per, ratio)
}

// pssKiB is a process's Pss from /proc/PID/smaps_rollup.
func pssKiB(b testing.TB, pid int) int64 {
	_, pss := memoryOf(pid)
	n, err := strconv.ParseInt(pss, 10, 64)
	if err != nil {
		body, _ := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		b.Fatalf("Pss of pid %d: %v\n%s", pid, err, body)
	}
	return n
}

func ms(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

func minDur(ds []time.Duration) time.Duration {
	m := ds[0]
	for _, d := range ds {
		m = min(m, d)
	}
	return m
}

func maxDur(ds []time.Duration) time.Duration {
	m := ds[0]
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}
