package snapshot

import (
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/benchloss"
)

// dirtyRuns is BenchmarkSnapshotDirty's cycles per dirty size. Fewer than benchRuns: each cycle also writes an
// untimed full snapshot of up to 1 GiB of guest memory, and the nested guests of the test host are fragile.
const dirtyRuns = 5

// BenchmarkSnapshotDirty: incremental snapshot latency against the MiB the guest dirtied since its parent, in
// a 1 GiB guest (and 16 MiB in a 128 MiB guest): sub-benchmark dirty; restore latency of a 128 MiB and a 1 GiB
// guest: sub-benchmark restore (-bench BenchmarkSnapshotDirty/restore runs it alone). A VM that is lost (the
// nested guest stalls, cube-vmm exits 10: README "Known problems") is replaced by a fresh one, counted and left
// out of the medians (benchloss); the cycles it finished still count.
func BenchmarkSnapshotDirty(b *testing.B) {
	b.Run("dirty", benchDirty)
	b.Run("restore", benchRestoreSize)
}

type dirtyKey struct{ mem, n int }

// dirtyRun is what benchDirty measures, per guest size and MiB dirtied.
type dirtyRun struct {
	snaps, frozen map[dirtyKey]series
	written       map[dirtyKey]int64
	tag           int
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
		loss := benchloss.New(b)
		d := &dirtyRun{snaps: map[dirtyKey]series{}, frozen: map[dirtyKey]series{}, written: map[dirtyKey]int64{}}
	sizes:
		for _, g := range guests {
			for _, n := range g.sizes {
				if !d.size(b, loss, dir, g.mem, g.rand, n) {
					break sizes
				}
			}
		}
		report(b, "\ncube-vmm incremental snapshot latency vs memory dirtied since the parent (1 vCPU, median of %d)\n", dirtyRuns)
		report(b, "| guest | dirtied | incremental snapshot | vCPUs frozen | memory written | vs 1 MiB |\n|---|---|---|---|---|---|\n")
		for _, g := range guests {
			for _, n := range g.sizes {
				k := dirtyKey{g.mem, n}
				report(b, "| %d MiB | %d MiB | %s | %s | %.1f MiB | %s |\n", g.mem, n, d.snaps[k], d.frozen[k],
					float64(d.written[k])/(1<<20), ratio(d.snaps[k].median(), d.snaps[dirtyKey{1024, 1}].median()))
			}
		}
		report(b, "1 GiB / 128 MiB guest at 16 MiB dirtied: %s (goal ≤ 2×)\n", ratio(d.snaps[dirtyKey{1024, 16}].median(), d.snaps[dirtyKey{128, 16}].median()))
		b.ReportMetric(ms(d.snaps[dirtyKey{1024, 16}].median()), "snap-1G-16M-ms")
		b.ReportMetric(ms(d.snaps[dirtyKey{128, 16}].median()), "snap-128M-16M-ms")
		loss.Check(b)
	}
}

// size takes dirtyRuns cycles with n MiB dirtied in a mem MiB guest, one sample of lost VMs: a VM lost is
// replaced by a fresh one. False once too many VMs were lost.
func (d *dirtyRun) size(b *testing.B, loss *benchloss.Counter, dir string, mem, rand, n int) bool {
	k := dirtyKey{mem, n}
	loss.Begin()
	for boot := 1; len(d.snaps[k]) < dirtyRuns; boot++ {
		report(b, "boot %d MiB guest (%d MiB random) for %d MiB dirtied, VM %d; test host: %s\n", mem, rand, n, boot, memAvailable())
		v, err := bootCubeErr(dir, mem, rand)
		if err != nil {
			err = fmt.Errorf("boot: %w", err)
		} else if err = d.cycles(b, v, dir, k); err == nil {
			err = v.stopErr()
		}
		if loss.Stop(b, loss.Lost(fmt.Sprintf("%d MiB guest, %d MiB dirtied, VM %d", mem, n, boot), err)) {
			return false
		}
	}
	return true
}

// cycles runs dirty cycles in v until k has dirtyRuns; a failed cycle abandons v.
func (d *dirtyRun) cycles(b *testing.B, v *cubeVM, dir string, k dirtyKey) error {
	for len(d.snaps[k]) < dirtyRuns {
		d.tag++
		t, r, err := v.dirtyCycle(dir, k.n, d.tag)
		if err != nil {
			v.abandon()
			return fmt.Errorf("cycle %d: %w", d.tag, err)
		}
		d.snaps[k] = append(d.snaps[k], t)
		d.frozen[k] = append(d.frozen[k], msDuration(r.FrozenMS))
		d.written[k] = r.MemoryBytes
		report(b, "cycle %d: %d MiB guest, %d MiB dirtied: incremental snapshot %.1f ms (frozen %.1f ms), %.1f MiB written\n",
			d.tag, k.mem, k.n, ms(t), r.FrozenMS, float64(r.MemoryBytes)/(1<<20))
	}
	return nil
}

// restoreRun is what benchRestoreSize measures, per guest size.
type restoreRun struct {
	restores, standbys map[int]series
	logs               []string
}

// benchRestoreSize: cube-vmm restore (launch → running) of a 128 MiB guest with 32 MiB of random data and of a
// 1 GiB guest with 256 MiB, each from a full snapshot taken just after its boot; then one more restore of each
// with cube-vmm's step log, and cube-vmm's package init cost.
func benchRestoreSize(b *testing.B) {
	dir := benchDir(b)
	guests := []struct{ mem, rand int }{{128, 32}, {1024, 256}}
	for b.Loop() {
		loss := benchloss.New(b)
		r := &restoreRun{restores: map[int]series{}, standbys: map[int]series{}}
		for _, g := range guests {
			if !r.size(b, loss, dir, g.mem, g.rand) {
				break
			}
		}
		report(b, "\ncube-vmm restore, launch → running, and into a standby cube-vmm, restore op → running (1 vCPU, median of %d)\n| guest | restore | standby restore |\n|---|---|---|\n", benchRuns)
		report(b, "| 128 MiB (32 MiB random) | %s | %s |\n| 1 GiB (256 MiB random) | %s | %s |\n", r.restores[128], r.standbys[128], r.restores[1024], r.standbys[1024])
		report(b, "1 GiB / 128 MiB restore: %s, standby restore: %s (goal: flat)\n", ratio(r.restores[1024].median(), r.restores[128].median()),
			ratio(r.standbys[1024].median(), r.standbys[128].median()))
		report(b, "one more restore each with cube-vmm's log (took = since its flags were parsed; steps in ms):\n%s\n", strings.Join(r.logs, "\n"))
		report(b, "cube-vmm process start (GODEBUG=inittrace=1): %s\n", initCost())
		b.ReportMetric(ms(r.restores[1024].median()), "restore-1G-ms")
		b.ReportMetric(ms(r.restores[128].median()), "restore-128M-ms")
		loss.Check(b)
	}
}

// size: a full snapshot of a freshly booted mem MiB guest, benchRuns restores and standby restores from it,
// and one more logged restore. False once too many VMs were lost.
func (r *restoreRun) size(b *testing.B, loss *benchloss.Counter, dir string, mem, rand int) bool {
	snap := filepath.Join(dir, fmt.Sprintf("restore-%d", mem))
	defer os.RemoveAll(snap)
	ok := loss.Run(b, 1, fmt.Sprintf("full snapshot of the %d MiB guest", mem), func(int) error {
		os.RemoveAll(snap) // an earlier attempt's
		v, err := bootCubeErr(dir, mem, rand)
		if err != nil {
			return fmt.Errorf("boot: %w", err)
		}
		if _, _, err := v.snapshotErr(snap, false); err != nil {
			v.abandon()
			return err
		}
		// The snapshot is taken: a VM lost as it stops is counted, and the snapshot still serves.
		return loss.Lost(fmt.Sprintf("stop the %d MiB guest", mem), v.stopErr())
	})
	ok = ok && loss.Run(b, benchRuns, fmt.Sprintf("restore of the %d MiB guest", mem), func(i int) error {
		d, err := restoreCubeErr(dir, snap)
		if err == nil {
			r.restores[mem] = append(r.restores[mem], d)
			report(b, "restore %d: %d MiB guest, launch → running %.1f ms\n", i+1, mem, ms(d))
		}
		return err
	})
	ok = ok && loss.Run(b, benchRuns, fmt.Sprintf("standby restore of the %d MiB guest", mem), func(int) error {
		d, err := restoreStandbyErr(dir, snap)
		if err == nil {
			r.standbys[mem] = append(r.standbys[mem], d)
		}
		return err
	})
	report(b, "standby restores, %d MiB guest: %s\n", mem, r.standbys[mem])
	// One more, logged (not in the medians): where a restore's time goes, by cube-vmm's own clock.
	return ok && loss.Run(b, 1, fmt.Sprintf("logged restore of the %d MiB guest", mem), func(int) error {
		d, log, err := restoreCubeErrLog(dir, snap, true)
		if err == nil {
			r.logs = append(r.logs, fmt.Sprintf("%d MiB guest: launch → running %.1f ms\n  %s", mem, ms(d), strings.ReplaceAll(log, "\n", "\n  ")))
			report(b, "%s\n", r.logs[len(r.logs)-1])
		}
		return err
	})
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
