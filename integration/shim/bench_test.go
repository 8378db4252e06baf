package shim

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/hypervisor/control"
	"github.com/cube-runtime/cube/shim/config"
	"github.com/cube-runtime/cube/shim/sandbox"
)

// BenchmarkCtrRunTrue: `ctr run --rm … true` through containerd 2.4.2 in the
// test host, with io.cube.v1 cold-booting a VM, io.cube.v1 restoring a
// template snapshot, and io.containerd.runc.v2 on overlayfs. Run with
// -benchtime 10x (or more): each variant logs its median and the end prints
// a table of medians and ratios.
func BenchmarkCtrRunTrue(b *testing.B) {
	d := startDaemons(b)
	medians := map[string]time.Duration{}
	run := func(b *testing.B, name string, args ...string) {
		var times []time.Duration
		for i := 0; b.Loop(); i++ {
			id := fmt.Sprintf("%s%d", name, i)
			start := time.Now()
			out, rc, err := d.ctrQuiet(nil, append(append([]string{"run", "--rm"}, args...), imageRef, id, "true")...)
			times = append(times, time.Since(start))
			if err != nil || rc != 0 {
				b.Fatalf("ctr run %v: rc %d %v\n%s", args, rc, err, out)
			}
		}
		m := median(times)
		medians[name] = m
		b.ReportMetric(float64(m.Microseconds())/1000, "median-ms")
		b.Logf("%s: %d runs, median %v, min %v, max %v", name, len(times), m, slices.Min(times), slices.Max(times))
	}
	b.Run("cube-cold", func(b *testing.B) { run(b, "cube-cold", cubeRuntime.args...) })
	b.Run("cube-template", func(b *testing.B) { run(b, "cube-template", d.templateRuntime(b)...) })
	b.Run("runc", func(b *testing.B) {
		if _, err := os.Stat("/cube/bin/runc"); err != nil {
			b.Skip("runc not in the test host (not found on the machine)")
		}
		run(b, "runc", runcRuntime.args...)
	})
	var t strings.Builder
	fmt.Fprintf(&t, "\n`ctr run --rm … true` in the test host (median of -benchtime runs):\n\n")
	fmt.Fprintf(&t, "| runtime | median | vs runc |\n|---|---|---|\n")
	for _, n := range []string{"cube-cold", "cube-template", "runc"} {
		m, ok := medians[n]
		if !ok {
			fmt.Fprintf(&t, "| %s | not run | |\n", n)
			continue
		}
		ratio := ""
		if r, ok := medians["runc"]; ok && r > 0 {
			ratio = fmt.Sprintf("%.2fx", float64(m)/float64(r))
		}
		fmt.Fprintf(&t, "| %s | %v | %s |\n", n, m.Round(time.Millisecond), ratio)
	}
	if c, ok := medians["cube-cold"]; ok {
		if tm, ok := medians["cube-template"]; ok && tm > 0 {
			fmt.Fprintf(&t, "\ncold boot / template restore: %.2fx\n", float64(c)/float64(tm))
		}
	}
	fmt.Print(t.String())
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// templateRuntime returns the ctr run flags for io.cube.v1 restoring a
// template made for this benchmark, after one probe run; it skips the
// benchmark where cube-vmm cannot attach the rootfs to a restored VM.
func (d *daemons) templateRuntime(b *testing.B) []string {
	conf, err := d.templateConfig(b)
	if err != nil {
		b.Fatal(err)
	}
	args := append([]string{"--runtime-config-path", conf}, cubeRuntime.args...)
	out, rc, err := d.ctrQuiet(nil, append(append([]string{"run", "--rm"}, args...), imageRef, "probe", "true")...)
	if err == nil && rc != 0 && strings.Contains(out, "disk-set") {
		b.Skipf("template restore needs cube-vmm's disk-set control op, which this cube-vmm lacks:\n%s", out)
	}
	if err != nil || rc != 0 {
		b.Fatalf("ctr run from the template: rc %d %v\n%s", rc, err, out)
	}
	return args
}

// templateConfig makes a template snapshot as docs/shim.md describes it (a
// VM cold-booted with the shim's machine shape and stub drives in every
// slot, snapshotted once its agent answers) and returns a shim config that
// restores sandboxes from it.
func (d *daemons) templateConfig(tb testing.TB) (string, error) {
	body := fmt.Sprintf(shimConfig, cubeVMM, guestKernel, guestInitrd, d.dir)
	cfg, err := config.Parse([]byte(body))
	if err != nil {
		return "", fmt.Errorf("shim config: %w", err)
	}
	vmDir := filepath.Join(d.dir, "tmplvm")
	tmpl := filepath.Join(d.dir, "template")
	conf := filepath.Join(d.dir, "shim-template.toml")
	sb, err := sandbox.New(sandbox.Options{
		ID: "template", Dir: vmDir, Kernel: cfg.Kernel, Initrd: cfg.Initrd, Cmdline: cfg.Cmdline,
		MemoryMiB: cfg.MemoryMiB, VCPUs: cfg.VCPUs, DiskSlots: int(cfg.DiskSlots), BootTimeout: 5 * time.Minute,
		VMM: &sandbox.ProcessVMM{Binary: cfg.VMM}, Dial: sandbox.DialAgent,
	})
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	if err := sb.Start(ctx, "", ""); err != nil {
		return "", fmt.Errorf("boot the template VM: %w", err)
	}
	defer sb.Stop(ctx)
	booted := time.Since(start)
	// The snapshot should not carry a live agent connection into every restored VM.
	sb.Agent().Close()
	c, err := control.Dial(filepath.Join(vmDir, "control.sock"))
	if err != nil {
		return "", fmt.Errorf("template VM control socket: %w", err)
	}
	defer c.Close()
	start = time.Now()
	if _, err := c.Snapshot(tmpl, false); err != nil {
		return "", fmt.Errorf("snapshot the template VM: %w", err)
	}
	tb.Logf("template: booted in %v, snapshotted in %v", booted, time.Since(start))
	if err := os.WriteFile(conf, []byte(body+fmt.Sprintf("template = %q\n", tmpl)), 0o644); err != nil {
		return "", err
	}
	return conf, nil
}

// BenchmarkCtrDensity starts idle io.cube.v1 sandboxes (`ctr run -d … sleep`),
// cold-booted and restored from a template, until their host memory — the
// proportional set size (PSS) of every cube-vmm and shim process — reaches a
// fixed budget, and prints how many fit and what each costs beyond its
// guest's own memory. Run with -benchtime 1x: the fill is the measurement.
func BenchmarkCtrDensity(b *testing.B) {
	d := startDaemons(b)
	b.Run("cold", func(b *testing.B) { d.density(b, "cold", cubeRuntime.args) })
	b.Run("template", func(b *testing.B) { d.density(b, "template", d.templateRuntime(b)) })
}

func (d *daemons) density(b *testing.B, name string, args []string) {
	const (
		budgetMiB = 1024
		maxBoxes  = 40 // a bound on the run time should the footprint be tiny
	)
	var (
		ids   []string
		total footprint
	)
	defer func() {
		for _, id := range ids {
			d.ctrQuiet(nil, "task", "rm", "-f", id)
			d.ctrQuiet(nil, "container", "rm", id)
		}
	}()
	memBefore := memAvailableKiB()
	stopped := "" // why the fill ended before the budget, if it did
	for b.Loop() {
		for len(ids) < maxBoxes && total.totalKiB() < budgetMiB*1024 {
			id := fmt.Sprintf("%s-idle%d", name, len(ids))
			if out, rc, err := d.ctrQuiet(nil, append(append([]string{"run", "-d"}, args...), imageRef, id, "sleep", "100000")...); err != nil || rc != 0 {
				if len(ids) == 0 {
					b.Fatalf("ctr run -d %s: rc %d %v\n%s", id, rc, err, out)
				}
				// Report what fit so far, and why the next one did not.
				stopped = fmt.Sprintf("sandbox %d failed to start: %s", len(ids)+1, lastLines(strings.TrimSpace(out), 1))
				b.Log(stopped)
				d.ctrQuiet(nil, "container", "rm", id)
				break
			}
			ids = append(ids, id)
			// Settle: the guest finished booting and the container started; idle from here on.
			time.Sleep(2 * time.Second)
			var err error
			if total, err = d.measure(ids); err != nil {
				b.Fatal(err)
			}
		}
	}
	n := len(ids)
	memDrop := memBefore - memAvailableKiB()
	per := func(kib int64) float64 { return float64(kib) / 1024 / float64(n) }
	cfg, _ := config.Parse(fmt.Appendf(nil, shimConfig, cubeVMM, guestKernel, guestInitrd, d.dir))
	overhead := per(total.vmmOtherKiB + total.shimKiB)
	fits := int(float64(budgetMiB) / (float64(total.totalKiB()) / 1024 / float64(n)))
	b.ReportMetric(float64(fits), "sandboxes/GiB")
	b.ReportMetric(overhead, "overhead-MiB/sandbox")
	capped := ""
	switch {
	case stopped != "":
		capped = " (then " + stopped + ")"
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
}

// footprint sums PSS (KiB) over sandboxes.
type footprint struct {
	guestKiB    int64 // cube-vmm's guest-memory mapping
	vmmOtherKiB int64 // the rest of cube-vmm
	shimKiB     int64
}

func (f footprint) totalKiB() int64 { return f.guestKiB + f.vmmOtherKiB + f.shimKiB }

// measure reads the PSS of each sandbox's cube-vmm (the task pid) and of its
// shim (cube-vmm's parent: the shim forks it).
func (d *daemons) measure(ids []string) (footprint, error) {
	out, rc, err := d.ctrQuiet(nil, "task", "ls")
	if err != nil || rc != 0 {
		return footprint{}, fmt.Errorf("ctr task ls: rc %d %v", rc, err)
	}
	pids := map[string]int{}
	for _, l := range strings.Split(out, "\n")[1:] {
		if f := strings.Fields(l); len(f) == 3 && f[2] == "RUNNING" {
			pids[f[0]], _ = strconv.Atoi(f[1])
		}
	}
	var fp footprint
	for _, id := range ids {
		pid, ok := pids[id]
		if !ok {
			return fp, fmt.Errorf("sandbox %s is not running:\n%s", id, out)
		}
		guest, other, err := vmmPSS(pid)
		if err != nil {
			return fp, err
		}
		ppid, err := parentPid(pid)
		if err != nil {
			return fp, err
		}
		_, shim, err := smapsPSS(ppid, func(int64) bool { return false })
		if err != nil {
			return fp, err
		}
		fp.guestKiB += guest
		fp.vmmOtherKiB += other
		fp.shimKiB += shim
	}
	return fp, nil
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
