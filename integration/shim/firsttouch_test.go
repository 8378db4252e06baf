package shim

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/benchloss"
	"github.com/cube-runtime/cube/integration/cubetest"
	"github.com/cube-runtime/cube/integration/kvmstats"
	"github.com/cube-runtime/cube/integration/procacct"
)

// BenchmarkFirstTouch: what a sandbox restored from a template pays for
// guest memory that the restore has not mapped yet. For io.cube.v1 cold and
// from a template it starts one sandbox (`ctr run -d … sleep`), then runs
// `ctr task exec … true` three times in it, timing each and reading the VM's
// KVM counters in the test host (debugfs, /sys/kernel/debug/kvm/PID-FD/)
// before and after. A restored VM's guest memory is a lazy MAP_PRIVATE
// mapping of the template's file: every page the guest touches for the first
// time after the restore costs a nested page fault (pf_taken), which a
// cold-booted VM paid during its boot. The table says how many the create
// path and each exec took, and what the first exec costs over the third.
// Diagnostics: no pass/fail on the figures; -benchtime is ignored (one
// sandbox per variant).
func BenchmarkFirstTouch(b *testing.B) {
	d := startDaemons(b)
	umount, err := kvmstats.Mount()
	if err != nil {
		b.Fatal(err)
	}
	defer umount()
	type row struct {
		name   string
		run    time.Duration
		cpu    map[string]int64 // ticks used during ctr run -d, by process name; "busy": the whole test host
		runC   map[string]int64
		execs  []time.Duration
		execCs []map[string]int64
		why    map[string]int64 // the test host's KVM exits during ctr run -d, by reason
	}
	var rows []row
	variant := func(name string, args []string) {
		id := "ft-" + name
		before := kvmstats.VMDirs()
		from := d.LogSize()
		var stopRIPs func() (map[uint64]int64, map[uint64]int64, error)
		if profile && name == "template" {
			var err error
			if stopRIPs, err = kvmstats.RIPs(); err != nil {
				b.Fatal(err)
			}
		}
		stopHist, histErr := kvmstats.ExitReasons()
		if histErr != nil {
			b.Logf("%s: no exit reasons: %v", name, histErr)
		}
		cpu0 := cpuTicks()
		start := time.Now()
		out, rc, err := d.CtrQuiet(nil, append(append(append([]string{"run", "-d"}, args...), cubetest.ImageRef, id), "sleep", "3600")...)
		took := time.Since(start)
		cpu := diffStats(cpuTicks(), cpu0)
		var why map[string]int64
		if histErr == nil {
			if why, histErr = stopHist(); histErr != nil {
				b.Logf("%s: no exit reasons: %v", name, histErr)
			}
		}
		if stopRIPs != nil {
			intr, npf, err := stopRIPs()
			if err != nil {
				b.Fatal(err)
			}
			// Ordering: after both samples stopped, so the sandbox that
			// reads the symbols counts in neither.
			syms := d.guestKallsyms(b, args)
			printRIPs("host interrupts (where guest time goes)", intr, syms)
			printRIPs("nested page faults (where the guest first touches memory)", npf, syms)
		}
		if err != nil || rc != 0 {
			d.Forget(id)
			b.Fatalf("%s: ctr run -d: rc %d %v\n%s", name, rc, err, out)
		}
		defer d.Forget(id)
		// The run's info lines (containerd's, the shim's, cube-vmm's), to
		// see what happened before the shim's Create began.
		b.Logf("%s: ctr run -d started %s, took %v; its log:\n%s", name, start.UTC().Format(time.RFC3339Nano), took,
			cubetest.LastLines(cubetest.GrepLines(d.LogFrom(from), "level=info"), 120))
		r := row{name: name, run: took, cpu: cpu, why: why}
		dir := ""
		if name != "runc" {
			if dir, err = vmDebugDir(before); err != nil {
				b.Logf("%s: no KVM counters: %v", name, err) // the timings and CPU still count
			} else {
				r.runC = kvmstats.Read(firstTouchCounters, dir)
			}
		}
		prev := r.runC
		for i := 1; i <= 3; i++ {
			start := time.Now()
			out, rc, err := d.CtrQuiet(nil, "task", "exec", "--exec-id", fmt.Sprintf("e%d", i), id, "true")
			took := time.Since(start)
			if err != nil || rc != 0 {
				b.Fatalf("%s: exec %d: rc %d %v\n%s", name, i, rc, err, out)
			}
			now := map[string]int64{}
			if dir != "" {
				now = kvmstats.Read(firstTouchCounters, dir)
			}
			r.execs = append(r.execs, took)
			r.execCs = append(r.execCs, diffStats(now, prev))
			prev = now
		}
		rows = append(rows, r)
		// The guest's side (the agent logs to the console): what the
		// restore, the mount and the create took in there.
		b.Logf("%s: console tail:\n%s", name, d.consoleTails(80))
	}
	b.Run("cold", func(b *testing.B) { variant("cold", d.ColdRuntime(b)) })
	b.Run("template", func(b *testing.B) {
		// The probe run makes the template (untimed), so the measured
		// sandbox is a restore.
		args := cubetest.CubeRuntime.Args
		if profile {
			args = d.noKASLRRuntime(b)
		}
		variant("template", d.templateRuntimeWith(b, benchloss.New(b), args))
	})
	b.Run("runc", func(b *testing.B) {
		// Untimed: the overlayfs snapshotter unpacks the image on runc's first run.
		warm := append(append([]string{"run", "--rm"}, cubetest.RuncRuntime.Args...), cubetest.ImageRef, "ft-runc-warm", "true")
		if out, rc, err := d.CtrQuiet(nil, warm...); err != nil || rc != 0 {
			d.Forget("ft-runc-warm")
			b.Fatalf("runc warm-up: rc %d %v\n%s", rc, err, out)
		}
		variant("runc", cubetest.RuncRuntime.Args)
	})
	fmt.Printf("\nCPU time the test host spent during `ctr run -d` (ms; per process name, children it reaped included):\n\n")
	names := []string{"containerd", "cube-snapshotte", "containerd-shim", "cube-vmm", "cube-vmm vcpus", "of which in KVM", "vcpus waited for a CPU"}
	fmt.Printf("| variant | wall | test host busy | %s | other |\n|---|---|---|%s---|\n", strings.Join(names, " | "), strings.Repeat("---|", len(names)))
	for _, r := range rows {
		fmt.Printf("| %s | %v | %d |", r.name, r.run.Round(time.Millisecond), r.cpu["busy"]*10)
		other := r.cpu["busy"]
		for _, n := range names {
			fmt.Printf(" %d |", r.cpu[n]*10)
			if n != "cube-vmm vcpus" && n != "of which in KVM" && n != "vcpus waited for a CPU" { // part of cube-vmm's
				other -= r.cpu[n]
			}
		}
		fmt.Printf(" %d |\n", other*10)
	}
	fmt.Printf("\nOne sandbox each: `ctr run -d` then `ctr task exec … true` ×3; KVM counters of its VM (test host debugfs)\n\n")
	fmt.Printf("| variant | step | took | exits | of them: pio | mmio | hlt | irq | nested page faults (pf_taken) | pf_fixed |\n|---|---|---|---|---|---|---|---|---|---|\n")
	counts := func(c map[string]int64) string {
		return fmt.Sprintf("%d | %d | %d | %d | %d | %d | %d", c["exits"], c["io_exits"], c["mmio_exits"], c["halt_exits"],
			c["irq_exits"], c["pf_taken"], c["pf_fixed"])
	}
	for _, r := range rows {
		fmt.Printf("| %s | ctr run -d (VM total) | %v | %s |\n", r.name, r.run.Round(time.Millisecond), counts(r.runC))
		for i, e := range r.execs {
			fmt.Printf("| %s | exec %d | %v | %s |\n", r.name, i+1, e.Round(time.Millisecond), counts(r.execCs[i]))
		}
		if len(r.why) > 0 {
			fmt.Printf("%s: the test host's KVM exits during ctr run -d by reason: %s\n", r.name, byCount(r.why))
		}
		if len(r.execs) == 3 {
			dpf := r.execCs[0]["pf_taken"] - r.execCs[2]["pf_taken"]
			dt := r.execs[0] - r.execs[2]
			per := "–"
			if dpf > 0 {
				per = fmt.Sprintf("%.0f µs", float64(dt.Microseconds())/float64(dpf))
			}
			fmt.Printf("%s: exec 1 − exec 3 = %v for %d more nested page faults (%s each)\n", r.name, dt.Round(time.Millisecond), dpf, per)
		}
	}
}

// guestProfileEnv, set, makes BenchmarkFirstTouch's template variant boot
// its guests with nokaslr and print the guest RIPs of its exits during
// ctr run -d (raw addresses: symbolize them with the guest kernel's
// System.map, the agent's with go tool addr2line).
const guestProfileEnv = "CUBE_GUEST_PROFILE"

var profile = os.Getenv(guestProfileEnv) != ""

// noKASLRRuntime is the default configuration with nokaslr on the guest's
// command line (a template of its own).
func (d *daemons) noKASLRRuntime(b *testing.B) []string {
	conf := filepath.Join(d.Dir, "shim-nokaslr.toml")
	body := strings.Replace(fmt.Sprintf(cubetest.ShimConfig, cubetest.CubeVMM, cubetest.GuestKernel, cubetest.GuestInitrd, d.Dir),
		`cmdline = "console=ttyS0 panic=-1 quiet"`, `cmdline = "console=ttyS0 panic=-1 quiet nokaslr"`, 1)
	if !strings.Contains(body, "nokaslr") {
		b.Fatal("the shim config has no cmdline line to add nokaslr to")
	}
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		b.Fatal(err)
	}
	return append([]string{"--runtime-config-path", conf}, cubetest.CubeRuntime.Args...)
}

// guestKallsyms reads the guest kernel's text symbols from a CAP_SYSLOG
// container of another sandbox of the same (nokaslr) template: the same
// addresses as the profiled guest's.
func (d *daemons) guestKallsyms(b *testing.B, args []string) kallsyms {
	cargs := append(append(append([]string{"run", "--rm", "--cap-add", "CAP_SYSLOG"}, args...), cubetest.ImageRef, "ft-kallsyms"), "cat", "/proc/kallsyms")
	out, rc, err := d.CtrQuiet(nil, cargs...)
	if err != nil || rc != 0 {
		d.Forget("ft-kallsyms")
		b.Fatalf("read the guest's kallsyms: rc %d %v\n%s", rc, err, cubetest.LastLines(out, 20))
	}
	var k kallsyms
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 3 || (f[1] != "t" && f[1] != "T") {
			continue
		}
		a, err := strconv.ParseUint(f[0], 16, 64)
		if err == nil && a != 0 {
			k = append(k, ksym{a, f[2]})
		}
	}
	if len(k) == 0 {
		b.Fatalf("no text symbols with addresses in the guest's /proc/kallsyms:\n%s", cubetest.LastLines(out, 5))
	}
	sort.Slice(k, func(i, j int) bool { return k[i].addr < k[j].addr })
	return k
}

type ksym struct {
	addr uint64
	name string
}

// kallsyms are text symbols by address.
type kallsyms []ksym

// name is the kernel function holding rip, "user" below the kernel.
func (k kallsyms) name(rip uint64) string {
	if rip < 0xffff800000000000 {
		return "user"
	}
	i := sort.Search(len(k), func(i int) bool { return k[i].addr > rip })
	if i == 0 {
		return "?"
	}
	return k[i-1].name
}

// printRIPs prints a sample's guest RIPs by kernel function (the 40 most
// frequent), then the user-space ones (the 20 most frequent, raw).
func printRIPs(what string, m map[uint64]int64, syms kallsyms) {
	byFn := map[string]int64{}
	user := map[string]int64{}
	var total int64
	for rip, n := range m {
		fn := syms.name(rip)
		byFn[fn] += n
		if fn == "user" {
			user[fmt.Sprintf("%#x", rip)] += n
		}
		total += n
	}
	fmt.Printf("\nguest RIPs of %s: %d samples\n", what, total)
	printTop(byFn, total, 40)
	fmt.Printf("user-space RIPs:\n")
	printTop(user, total, 20)
}

// printTop prints the n largest counts of m with their share of total.
func printTop(m map[string]int64, total int64, n int) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || m[keys[i]] == m[keys[j]] && keys[i] < keys[j] })
	for i, k := range keys {
		if i == n {
			break
		}
		fmt.Printf("%6d %5.1f%% %s\n", m[k], 100*float64(m[k])/float64(total), k)
	}
}

// byCount lists counts as "name n, …", largest first.
func byCount(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || m[keys[i]] == m[keys[j]] && keys[i] < keys[j] })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// cpuTicks is the CPU time (clock ticks: user, system and that of reaped
// children) of the test host's processes summed by name (comm), and under
// "busy" the whole test host's busy time from /proc/stat.
func cpuTicks() map[string]int64 {
	m := map[string]int64{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		st, ok := cubetest.ReadStat(filepath.Join("/proc", e.Name(), "stat"))
		if !ok {
			continue
		}
		m[st.Comm] += int64(st.UTime + st.STime + st.CUTime + st.CSTime)
		if st.Comm == "cube-vmm" {
			all, kernel, wait := vcpuTicks(e.Name())
			m["cube-vmm vcpus"] += all
			m["of which in KVM"] += kernel
			m["vcpus waited for a CPU"] += wait
		}
	}
	busy, _ := procacct.HostCPU()
	m["busy"] = int64(busy / (10 * time.Millisecond)) // clock ticks
	return m
}

// vcpuTicks is the CPU time of process pid's vCPU threads (named vcpuN):
// the guest's, with the exits KVM handles in the kernel; kernel is the
// system time alone (exit handling: the guest's own time counts as user);
// wait is how long they were runnable but not running (schedstat's
// run-queue wait). All in clock ticks.
func vcpuTicks(pid string) (n, kernel, wait int64) {
	tasks, _ := filepath.Glob(filepath.Join("/proc", pid, "task", "*"))
	for _, t := range tasks {
		st, ok := cubetest.ReadStat(filepath.Join(t, "stat"))
		if !ok || !strings.HasPrefix(st.Comm, "vcpu") {
			continue
		}
		n += int64(st.UTime + st.STime)
		kernel += int64(st.STime)
		b, _ := os.ReadFile(filepath.Join(t, "schedstat"))
		if f := strings.Fields(string(b)); len(f) == 3 {
			ns, _ := strconv.ParseInt(f[1], 10, 64)
			wait += ns / 1e7
		}
	}
	return n, kernel, wait
}

// vmDebugDir is the debugfs directory of the one KVM VM that was not among
// before.
func vmDebugDir(before []string) (string, error) {
	var fresh []string
	for _, d := range kvmstats.VMDirs() {
		if !slices.Contains(before, d) {
			fresh = append(fresh, d)
		}
	}
	if len(fresh) != 1 {
		return "", fmt.Errorf("want one new KVM VM in debugfs, found %v", fresh)
	}
	return fresh[0], nil
}

// firstTouchCounters are the VM's KVM counters BenchmarkFirstTouch shows.
var firstTouchCounters = []string{"exits", "io_exits", "mmio_exits", "halt_exits", "irq_exits", "pf_taken", "pf_fixed"}

func diffStats(now, prev map[string]int64) map[string]int64 {
	m := map[string]int64{}
	for k, v := range now {
		m[k] = v - prev[k]
	}
	return m
}
