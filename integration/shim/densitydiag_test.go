package shim

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/cube-runtime/cube/integration/cubetest"
)

// What BenchmarkCtrDensity logs as it fills the test host, so that a sandbox that fails late says what was
// running out: the test host's memory and reclaim, its load, and per-VMM resources.

// densityVMStat are the /proc/vmstat counters that move when the test host reclaims or moves pages (each
// move of a page mapped into a nested guest must reach the emulated CPU's nested TLB).
var densityVMStat = []string{"pgscan_kswapd", "pgscan_direct", "pgsteal_kswapd", "pgsteal_direct", "compact_stall",
	"compact_migrate_scanned", "pgmigrate_success", "thp_fault_alloc", "oom_kill", "workingset_refault_file"}

// hostFacts is one line of the test host's state: memory, reclaim counters, load, processes, open files.
func hostFacts() string {
	var b strings.Builder
	mem := procKV("/proc/meminfo")
	for _, k := range []string{"MemTotal", "MemFree", "MemAvailable", "Cached", "Shmem", "AnonPages", "PageTables", "KernelStack", "SUnreclaim"} {
		fmt.Fprintf(&b, "%s=%dM ", k, mem[k]/1024)
	}
	vm := procKV("/proc/vmstat")
	for _, k := range densityVMStat {
		fmt.Fprintf(&b, "%s=%d ", k, vm[k])
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(&b, "load=%q ", strings.TrimSpace(string(load)))
	fnr, _ := os.ReadFile("/proc/sys/fs/file-nr")
	fmt.Fprintf(&b, "file-nr=%q", strings.TrimSpace(string(fnr)))
	return b.String()
}

// procKV reads "key: value" or "key value" lines (meminfo in kB, vmstat counts).
func procKV(path string) map[string]int64 {
	out := map[string]int64{}
	b, _ := os.ReadFile(path)
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(strings.Replace(l, ":", " ", 1))
		if len(f) >= 2 {
			out[f[0]], _ = strconv.ParseInt(f[1], 10, 64)
		}
	}
	return out
}

// procFacts is one process's threads, open files and VmRSS.
func procFacts(pid int) string {
	st := procKV(fmt.Sprintf("/proc/%d/status", pid))
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return fmt.Sprintf("pid %d threads=%d fds=%d rss=%dM", pid, st["Threads"], len(fds), st["VmRSS"]/1024)
}

// kernelLogTail is the end of the test host's kernel log (KVM's complaints, the OOM killer, hung tasks).
func kernelLogTail(n int) string {
	if p, err := exec.LookPath("dmesg"); err == nil {
		if out, err := exec.Command(p).CombinedOutput(); err == nil {
			return cubetest.LastLines(string(out), n)
		}
	}
	f, err := os.OpenFile("/dev/kmsg", os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return "kernel log: " + err.Error()
	}
	defer f.Close()
	var lines []string
	buf := make([]byte, 8192)
	for {
		k, err := f.Read(buf)
		if err != nil || k == 0 {
			break
		}
		rec := string(buf[:k])
		if _, msg, ok := strings.Cut(rec, ";"); ok {
			lines = append(lines, strings.TrimRight(msg, "\n"))
		}
	}
	return cubetest.LastLines(strings.Join(lines, "\n"), n)
}

// consoleTails is the tail of every sandbox console still on disk (the running ones: a failed sandbox's
// state dir is gone, its console tail is in the shim's log).
func (d *daemons) consoleTails(n int) string {
	logs, _ := filepath.Glob(filepath.Join(d.Dir, "vms", "*", "console.log"))
	var b strings.Builder
	for _, l := range logs {
		if c, err := os.ReadFile(l); err == nil {
			fmt.Fprintf(&b, "%s:\n%s\n", l, cubetest.LastLines(string(c), n))
		}
	}
	return b.String()
}
