package cubetest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/cube-runtime/cube/integration/procacct"
)

// ProcsNamed lists the pids of processes whose argv[0] is named name.
func ProcsNamed(name string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		argv0, _, _ := bytes.Cut(b, []byte{0})
		if filepath.Base(string(argv0)) == name {
			pids = append(pids, pid)
		}
	}
	return pids
}

// ThreadStat is what the tests read of /proc/…/stat.
type ThreadStat = procacct.Stat

// ReadStat parses the stat file at path (procacct.ParseStat).
func ReadStat(path string) (ThreadStat, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return ThreadStat{}, false
	}
	return procacct.ParseStat(string(b))
}

// ProcThreads describes process pid's threads for a hang report: each
// thread's name, state (R running, S sleeping, D in the kernel
// uninterruptibly) and the kernel function it waits in, and its CPU time.
func ProcThreads(pid int) string {
	dir := filepath.Join("/proc", fmt.Sprint(pid), "task")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Sprintf("pid %d: %v", pid, err)
	}
	var b strings.Builder
	for _, e := range ents {
		st, ok := ReadStat(filepath.Join(dir, e.Name(), "stat"))
		if !ok {
			continue
		}
		wchan, _ := os.ReadFile(filepath.Join(dir, e.Name(), "wchan"))
		fmt.Fprintf(&b, " %s[%s %s %d+%dt]", st.Comm, st.State, string(wchan), st.UTime, st.STime)
	}
	return b.String()
}

// BusyThreads lists the threads of every process that are running or
// waiting to run (R) or blocked in the kernel (D), and the processes that
// have used the most CPU, for a hang report.
func BusyThreads() string {
	ents, _ := os.ReadDir("/proc")
	type proc struct {
		name  string
		ticks int
	}
	var busy []string
	var top []proc
	for _, e := range ents {
		if _, err := fmt.Sscanf(e.Name(), "%d", new(int)); err != nil {
			continue
		}
		tasks, _ := os.ReadDir(filepath.Join("/proc", e.Name(), "task"))
		total := 0
		pname := ""
		for _, t := range tasks {
			st, ok := ReadStat(filepath.Join("/proc", e.Name(), "task", t.Name(), "stat"))
			if !ok {
				continue
			}
			total += st.UTime + st.STime
			if pname == "" {
				pname = e.Name() + " " + st.Comm
			}
			if st.State == "R" || st.State == "D" {
				busy = append(busy, fmt.Sprintf("%s/%s %s %s (%d+%dt)", e.Name(), t.Name(), st.Comm, st.State, st.UTime, st.STime))
			}
		}
		top = append(top, proc{pname, total})
	}
	sort.Slice(top, func(i, j int) bool { return top[i].ticks > top[j].ticks })
	var b strings.Builder
	fmt.Fprintf(&b, "threads running or runnable (R) or in D: %s\nmost CPU so far:", strings.Join(busy, ", "))
	for i := 0; i < len(top) && i < 12; i++ {
		fmt.Fprintf(&b, " %s=%dt", top[i].name, top[i].ticks)
	}
	return b.String() + "\n"
}
