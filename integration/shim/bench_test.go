package shim

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/benchloss"
	"github.com/cube-runtime/cube/integration/cubetest"
	"github.com/cube-runtime/cube/shim/config"
)

// BenchmarkCtrRunTrue: `ctr run --rm … true` through containerd 2.4.2 in the
// test host, with io.cube.v1 cold-booting a VM (templates = false),
// io.cube.v1 with the default configuration (restored from the automatic
// template of its shape), and io.containerd.runc.v2 on overlayfs. Run with
// -benchtime 10x (or more): each variant logs its median and the end prints
// a table of medians and ratios. With runc in the test host, every template
// run is also paired with a runc run, in alternating order, and a second
// table gives those interleaved runs' medians; a third, the test host's CPU
// per run by process. Read both ratios: the batches run minutes apart on a
// machine whose load drifts, and runc runs beside template runs have cost
// the test host 22–32% more CPU than runc's batch (the load then, or a VM's
// run leaving the emulated test host slower for a while), which flatters
// the interleaved ratio. A run whose sandbox VM was lost (its VMM
// exited 10 or was killed, or the agent never answered) is taken again,
// counted and left out of the median (benchloss).
func BenchmarkCtrRunTrue(b *testing.B) {
	d := startDaemons(b)
	medians := map[string]time.Duration{}
	lost := map[string]int{}
	steps := map[string]*runSteps{}
	// Interleaved: each template run has a runc run beside it, timed alike,
	// the pair's order alternating (runc first in every second pair), so
	// both variants are taken on the machine as it was then (the batches'
	// medians come minutes apart, and a shared machine drifts) and neither
	// always runs right after the other (a VM's teardown, containerd's
	// cleanup of a removed container). It follows the load, but not the
	// steady state: see the doc comment above.
	_, err := os.Stat("/cube/bin/runc")
	haveRunc := err == nil
	var pairs pairedRuns
	cpu := newRunCPU()
	// runTrue is one timed `ctr run --rm … id true` with the runtime flags
	// args, its CPU counted for variant; from is where its lines begin in
	// containerd's log.
	runTrue := func(b *testing.B, variant, id string, args []string) (start time.Time, took time.Duration, from int64, err error) {
		cargs := append(append([]string{"run", "--rm"}, args...), cubetest.ImageRef, id, "true")
		from = d.LogSize()
		err = cpu.measure(b, variant, func() error {
			start = time.Now()
			out, rc, err := d.CtrQuiet(nil, cargs...)
			took = time.Since(start)
			if err != nil || rc != 0 {
				d.Forget(id)
				return d.CtrFailure(cargs, out, rc, err, from)
			}
			return nil
		})
		return start, took, from, err
	}
	runc := func(b *testing.B, id string) time.Duration {
		_, took, _, err := runTrue(b, "runc (interleaved)", id, cubetest.RuncRuntime.Args)
		if err != nil {
			b.Fatalf("interleaved runc run: %v", err)
		}
		return took
	}
	run := func(b *testing.B, loss *benchloss.Counter, name string, args ...string) {
		st := newRunSteps()
		steps[name] = st
		var times []time.Duration
		n := 0
		interleave := name == "cube-template" && haveRunc
		for b.Loop() {
			runcFirst := interleave && len(times)%2 == 1
			var r, took time.Duration
			if runcFirst {
				r = runc(b, fmt.Sprintf("pair%d", len(times)+1))
			}
			loss.Stop(b, loss.Sample(fmt.Sprintf("%s run %d", name, len(times)+1), func() error {
				n++
				id := fmt.Sprintf("%s%d", name, n) // a fresh sandbox per attempt
				start, t, from, err := runTrue(b, name, id, args)
				if err != nil {
					return err
				}
				took = t
				times = append(times, took)
				if strings.HasPrefix(name, "cube") {
					st.add(d.LogFrom(from), start, took)
				}
				return nil
			}))
			if interleave {
				if !runcFirst {
					r = runc(b, fmt.Sprintf("pair%d", len(times)))
				}
				pairs.add(took, r)
			}
		}
		lost[name] = loss.N()
		if len(times) > 0 {
			m := cubetest.Median(times)
			medians[name] = m
			b.ReportMetric(float64(m.Microseconds())/1000, "median-ms")
			b.Logf("%s: %d runs, median %v, min %v, max %v", name, len(times), m, slices.Min(times), slices.Max(times))
		}
		loss.Check(b)
	}
	b.Run("cube-cold", func(b *testing.B) { run(b, benchloss.New(b), "cube-cold", d.ColdRuntime(b)...) })
	b.Run("cube-template", func(b *testing.B) {
		if haveRunc {
			// Untimed: the overlayfs snapshotter unpacks the image on runc's first run.
			if _, _, _, err := runTrue(b, "untimed", "pair-warm", cubetest.RuncRuntime.Args); err != nil {
				b.Fatal(err)
			}
		}
		loss := benchloss.New(b)
		run(b, loss, "cube-template", d.templateRuntime(b, loss)...)
	})
	b.Run("runc", func(b *testing.B) {
		if !haveRunc {
			b.Skip("runc not in the test host (not found on the machine)")
		}
		run(b, benchloss.New(b), "runc", cubetest.RuncRuntime.Args...)
	})
	fmt.Print(runTable(medians, lost))
	fmt.Print(pairs.table())
	fmt.Print(cpu.table([]string{"cube-template", "runc (interleaved)", "runc", "cube-cold"}))
	for _, n := range []string{"cube-template", "cube-cold"} {
		if st := steps[n]; st != nil {
			fmt.Print(st.table(n))
		}
	}
}

// pairedRuns are BenchmarkCtrRunTrue's interleaved template and runc runs.
type pairedRuns struct{ template, runc []time.Duration }

func (p *pairedRuns) add(template, runc time.Duration) {
	p.template = append(p.template, template)
	p.runc = append(p.runc, runc)
}

// table reports the interleaved runs: each variant's median, their ratio
// and the spread of the pairs' own ratios.
func (p *pairedRuns) table() string {
	if len(p.template) == 0 {
		return ""
	}
	ratios := make([]float64, len(p.template))
	for i := range p.template {
		ratios[i] = float64(p.template[i]) / float64(p.runc[i])
	}
	slices.Sort(ratios)
	tm, rm := cubetest.Median(p.template), cubetest.Median(p.runc)
	var t strings.Builder
	fmt.Fprintf(&t, "\ncube-template and runc interleaved (%d pairs, runc first in every second pair):\n\n", len(ratios))
	fmt.Fprintf(&t, "| template median | runc median | template / runc | pairs' ratios: median (min–max) |\n|---|---|---|---|\n")
	fmt.Fprintf(&t, "| %v | %v | %.2fx | %.2fx (%.2f–%.2fx) |\n", tm.Round(time.Millisecond), rm.Round(time.Millisecond),
		float64(tm)/float64(rm), ratios[len(ratios)/2], ratios[0], ratios[len(ratios)-1])
	return t.String()
}

// runTable is BenchmarkCtrRunTrue's table.
func runTable(medians map[string]time.Duration, lost map[string]int) string {
	var t strings.Builder
	fmt.Fprintf(&t, "\n`ctr run --rm … true` in the test host (median of -benchtime runs):\n\n")
	fmt.Fprintf(&t, "| runtime | median | vs runc | lost VMs |\n|---|---|---|---|\n")
	total := 0
	for _, n := range []string{"cube-cold", "cube-template", "runc"} {
		total += lost[n]
		m, ok := medians[n]
		if !ok {
			fmt.Fprintf(&t, "| %s | not run | | %d |\n", n, lost[n])
			continue
		}
		ratio := ""
		if r, ok := medians["runc"]; ok && r > 0 {
			ratio = fmt.Sprintf("%.2fx", float64(m)/float64(r))
		}
		fmt.Fprintf(&t, "| %s | %v | %s | %d |\n", n, m.Round(time.Millisecond), ratio, lost[n])
	}
	if c, ok := medians["cube-cold"]; ok {
		if tm, ok := medians["cube-template"]; ok && tm > 0 {
			fmt.Fprintf(&t, "\ncold boot / template restore: %.2fx\n", float64(c)/float64(tm))
		}
	}
	fmt.Fprintf(&t, "lost VMs: %d (left out of the medians)\n", total)
	return t.String()
}

// templateRuntime returns the ctr run flags for io.cube.v1 with the default
// configuration (automatic templates), after one untimed probe run that
// makes the template if no earlier run did (docs/shim.md, "Templates"). A
// probe sandbox that is lost is run again (loss).
func (d *daemons) templateRuntime(b *testing.B, loss *benchloss.Counter) []string {
	return d.templateRuntimeWith(b, loss, cubetest.CubeRuntime.Args)
}

// templateRuntimeWith is templateRuntime for the runtime flags args.
func (d *daemons) templateRuntimeWith(b *testing.B, loss *benchloss.Counter, args []string) []string {
	loss.Stop(b, loss.Sample("template probe run", func() error {
		cargs := append(append([]string{"run", "--rm"}, args...), cubetest.ImageRef, "probe", "true")
		from := d.LogSize()
		start := time.Now()
		out, rc, err := d.CtrQuiet(nil, cargs...)
		if err != nil || rc != 0 {
			d.Forget("probe")
			return d.CtrFailure(cargs, out, rc, err, from)
		}
		log := d.LogFrom(from)
		if !strings.Contains(log, cubetest.LogRestoring) {
			b.Fatalf("probe run was not restored from a template; shim log:\n%s", cubetest.GrepLines(log, "template"))
		}
		b.Logf("probe run (template made: %v) took %v", strings.Contains(log, cubetest.LogTemplateMade), time.Since(start))
		return nil
	}))
	return args
}

// BenchmarkCtrDensity starts idle io.cube.v1 sandboxes (`ctr run -d … sleep`),
// cold-booted and restored from a template, until their host memory — the
// proportional set size (PSS) of every cube-vmm and shim process — reaches a
// fixed budget, and prints how many fit and what each costs beyond its
// guest's own memory. At the end every sandbox must still answer. A sandbox
// that fails to start, or does not answer at the end, is a failure: counted,
// printed with its evidence (the guest's console tail and how its VMM ended,
// from the shim's log; the test host's memory, reclaim counters and kernel
// log) and failing the benchmark; no sandbox is retried. Run with -benchtime
// 1x: the fill is the measurement.
func BenchmarkCtrDensity(b *testing.B) {
	d := startDaemons(b)
	b.Run("cold", func(b *testing.B) { d.density(b, "cold", d.ColdRuntime(b)) })
	b.Run("template", func(b *testing.B) {
		loss := benchloss.New(b) // the untimed probe run that makes the template only
		args := d.templateRuntime(b, loss)
		loss.Check(b)
		d.density(b, "template", args)
	})
}

// The fill of BenchmarkCtrDensity.
const (
	densityBudgetMiB = 1024
	// A bound on the run time should the footprint be tiny: above what the template fill needs to use the
	// budget (15.4 MiB of PSS a restored sandbox at 40 of them, so about 67).
	densityMaxBoxes = 72
	// The fill stops after this many sandboxes failed to start or died after they started (each is a
	// failure already).
	densityMaxFailures = 3
)

func (d *daemons) density(b *testing.B, name string, args []string) {
	const budgetMiB, maxBoxes = densityBudgetMiB, densityMaxBoxes
	var ids []string
	defer func() {
		for _, id := range ids {
			d.Forget(id)
		}
	}()
	memBefore := memAvailableKiB()
	var total footprint
	var failures []string // sandboxes that failed to start or died during the fill
	for b.Loop() {
		total, failures = d.fill(b, name, args, &ids)
	}
	n := len(ids)
	if n == 0 {
		b.Fatalf("no %s sandbox started:\n%s", name, strings.Join(failures, "\n"))
	}
	memDrop := memBefore - memAvailableKiB()
	b.Logf("filled: %d sandboxes; test host: %s", n, hostFacts())
	failed := d.answering(b, ids)
	per := func(kib int64) float64 { return float64(kib) / 1024 / float64(n) }
	cfg, _ := config.Parse(fmt.Appendf(nil, cubetest.ShimConfig, cubetest.CubeVMM, cubetest.GuestKernel, cubetest.GuestInitrd, d.Dir))
	overhead := per(total.vmmOtherKiB + total.shimKiB)
	fits := int(float64(budgetMiB) / (float64(total.totalKiB()) / 1024 / float64(n)))
	b.ReportMetric(float64(fits), "sandboxes/GiB")
	b.ReportMetric(overhead, "overhead-MiB/sandbox")
	b.ReportMetric(float64(len(failures)+len(failed)), "failed-sandboxes")
	capped := ""
	switch {
	case len(failures) >= densityMaxFailures:
		capped = fmt.Sprintf(" (stopped after %d failures)", len(failures))
	case n == maxBoxes && total.totalKiB() < budgetMiB*1024:
		capped = " (cap reached before the budget)"
	}
	fmt.Printf("\nIdle io.cube.v1 sandboxes, %s (`ctr run -d … sleep`, guest memory_mib %d), filling a %d MiB budget of cube-vmm + shim PSS:\n\n", name, cfg.MemoryMiB, budgetMiB)
	fmt.Printf("| measure (%s) | value |\n|---|---|\n", name)
	fmt.Printf("| sandboxes started | %d%s |\n", n, capped)
	fmt.Printf("| total PSS (cube-vmm + shim) | %.1f MiB |\n", float64(total.totalKiB())/1024)
	fmt.Printf("| guest memory resident (PSS), per sandbox | %.1f MiB (of %d MiB) |\n", per(total.guestKiB), cfg.MemoryMiB)
	fmt.Printf("| cube-vmm beyond guest memory, per sandbox | %.1f MiB |\n", per(total.vmmOtherKiB))
	fmt.Printf("| shim, per sandbox | %.1f MiB |\n", per(total.shimKiB))
	fmt.Printf("| host overhead beyond guest memory, per sandbox | %.1f MiB |\n", overhead)
	fmt.Printf("| host MemAvailable drop, per sandbox | %.1f MiB |\n", per(memDrop))
	fmt.Printf("| sandboxes per %d MiB at this PSS | %d |\n", budgetMiB, fits)
	fmt.Printf("| sandboxes that failed to start or died during the fill | %d |\n", len(failures))
	fmt.Printf("| sandboxes answering at the end (RUNNING, `ctr task exec … true` rc 0) | %d of %d |\n", n-len(failed), n)
	if len(failures)+len(failed) > 0 {
		b.Errorf("%d sandboxes failed to start or died during the fill, and %d of %d did not answer at the end:\n%s", len(failures), len(failed), n,
			strings.Join(append(failures, failed...), "\n"))
	}
}

// answering checks, after the fill, that every sandbox still runs and its guest agent still serves it: the
// task is RUNNING in `ctr task ls` and `ctr task exec … true` ends 0. It returns one line per sandbox that
// did not (a failure the benchmark counts; no timing is judged).
func (d *daemons) answering(b *testing.B, ids []string) []string {
	ls, _, _ := d.CtrQuiet(nil, "task", "ls")
	running := map[string]bool{}
	for _, l := range strings.Split(ls, "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[2] == "RUNNING" {
			running[f[0]] = true
		}
	}
	var failed []string
	for i, id := range ids {
		if !running[id] {
			failed = append(failed, id+": not RUNNING in ctr task ls")
			continue
		}
		out, rc, err := d.CtrQuiet(nil, "task", "exec", "--exec-id", fmt.Sprintf("answer%d", i), id, "true")
		if err != nil || rc != 0 {
			failed = append(failed, fmt.Sprintf("%s: ctr task exec true: rc %d %v: %s", id, rc, err, cubetest.LastLines(strings.TrimSpace(out), 5)))
		}
	}
	if len(failed) > 0 {
		b.Logf("test host kernel log (tail):\n%s\nconsoles of the sandboxes still on disk:\n%s", kernelLogTail(30), d.consoleTails(10))
	}
	return failed
}

// fill starts idle sandboxes until their footprint reaches the budget (or the cap, or densityMaxFailures
// failures), and returns it and one line per sandbox that failed to start or died during the fill. A failed
// sandbox is removed and logged with its evidence and the test host's state; the fill goes on under a new id.
func (d *daemons) fill(b *testing.B, name string, args []string, ids *[]string) (footprint, []string) {
	var total footprint
	var failures []string
	from := d.LogSize()
	for n := 0; len(*ids) < densityMaxBoxes && total.totalKiB() < densityBudgetMiB*1024 && len(failures) < densityMaxFailures; {
		n++
		id := fmt.Sprintf("%s-idle%d", name, n)
		t0 := time.Now()
		if err := d.startIdle(id, args); err != nil {
			b.Logf("%s (sandbox %d) failed after %v: %v\ntest host: %s\ntest host kernel log (tail):\n%s", id, len(*ids)+1,
				time.Since(t0).Round(time.Millisecond), err, hostFacts(), kernelLogTail(30))
			failures = append(failures, fmt.Sprintf("%s (sandbox %d): %s", id, len(*ids)+1, cubetest.FirstLine(err.Error())))
			continue
		}
		b.Logf("%s started in %v; test host: %s", id, time.Since(t0).Round(time.Millisecond), hostFacts())
		*ids = append(*ids, id)
		var dead []string
		var err error
		if total, dead, err = d.measure(*ids); err != nil {
			b.Fatal(err)
		}
		for _, id := range dead {
			// A sandbox that ran died since: the shim logged how its VMM ended and its guest console.
			b.Logf("%s died after it started:\nthe shim's lines about it:\n%s\ntest host: %s\ntest host kernel log (tail):\n%s", id,
				cubetest.GrepLines(d.VMMLog(from), "sandbox="+id), hostFacts(), kernelLogTail(30))
			failures = append(failures, id+": died after it started (its VMM ended)")
			d.Forget(id)
			*ids = slices.DeleteFunc(*ids, func(s string) bool { return s == id })
		}
		if len(dead) > 0 {
			if total, _, err = d.measure(*ids); err != nil {
				b.Fatal(err)
			}
		}
	}
	return total, failures
}

// startIdle starts sandbox id (`ctr run -d … sleep`) and lets it settle (the guest finished booting and the
// container started; idle from here on); a sandbox that failed or no longer runs is removed, with its failure
// classified (benchloss.Sandbox).
func (d *daemons) startIdle(id string, args []string) error {
	cargs := append(append([]string{"run", "-d"}, args...), cubetest.ImageRef, id, "sleep", "100000")
	from := d.LogSize()
	out, rc, err := d.CtrQuiet(nil, cargs...)
	if err != nil || rc != 0 {
		d.Forget(id)
		return d.CtrFailure(cargs, out, rc, err, from)
	}
	time.Sleep(2 * time.Second)
	ls, _, _ := d.CtrQuiet(nil, "task", "ls")
	for _, l := range strings.Split(ls, "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == id && f[2] == "RUNNING" {
			return nil
		}
	}
	d.Forget(id)
	return d.CtrFailure([]string{"task", "ls"}, fmt.Sprintf("sandbox %s is not running after it started:\n%s", id, ls), 1, nil, from)
}

// footprint sums PSS (KiB) over sandboxes.
type footprint struct {
	guestKiB    int64 // cube-vmm's guest-memory mapping
	vmmOtherKiB int64 // the rest of cube-vmm
	shimKiB     int64
}

func (f footprint) totalKiB() int64 { return f.guestKiB + f.vmmOtherKiB + f.shimKiB }

// measure reads the PSS of each sandbox's cube-vmm (the task pid) and of its shim (cube-vmm's parent: the
// shim forks it), over the sandboxes still running, and returns the ones that are not (their VMM ended).
func (d *daemons) measure(ids []string) (footprint, []string, error) {
	out, rc, err := d.CtrQuiet(nil, "task", "ls")
	if err != nil || rc != 0 {
		return footprint{}, nil, fmt.Errorf("ctr task ls: rc %d %v", rc, err)
	}
	pids := map[string]int{}
	for _, l := range strings.Split(out, "\n")[1:] {
		if f := strings.Fields(l); len(f) == 3 && f[2] == "RUNNING" {
			pids[f[0]], _ = strconv.Atoi(f[1])
		}
	}
	var fp footprint
	var dead []string
	for _, id := range ids {
		pid, ok := pids[id]
		if !ok {
			dead = append(dead, id)
			continue
		}
		guest, other, err := vmmPSS(pid)
		if err != nil {
			if !processExists(pid) { // it died since ctr task ls
				dead = append(dead, id)
				continue
			}
			return fp, nil, err
		}
		ppid, err := parentPid(pid)
		if err != nil {
			return fp, nil, err
		}
		_, shim, err := smapsPSS(ppid, func(int64) bool { return false })
		if err != nil {
			return fp, nil, err
		}
		fp.guestKiB += guest
		fp.vmmOtherKiB += other
		fp.shimKiB += shim
	}
	return fp, dead, nil
}

// vmmPSS splits cube-vmm's PSS into its guest-memory mapping (a mapping of
// at least 64 MiB: the guest's RAM) and everything else.
func vmmPSS(pid int) (guest, other int64, err error) {
	return smapsPSS(pid, func(sizeKiB int64) bool { return sizeKiB >= 64<<10 })
}

// smapsPSS sums Pss (KiB) over /proc/pid/smaps: over the mappings whose size
// match accepts, and over the rest.
func smapsPSS(pid int, match func(sizeKiB int64) bool) (matched, rest int64, err error) {
	f, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("smaps of %d: %w", pid, err)
	}
	var size int64
	sc := bufio.NewScanner(bytes.NewReader(f))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		kib, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "Size":
			size = kib
		case "Pss":
			if match(size) {
				matched += kib
			} else {
				rest += kib
			}
		}
	}
	return matched, rest, sc.Err()
}

func processExists(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return err == nil
}

func parentPid(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	return strconv.Atoi(f[1])
}

func memAvailableKiB() int64 {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "MemAvailable:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}
