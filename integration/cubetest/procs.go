package cubetest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
		stat, _ := os.ReadFile(filepath.Join(dir, e.Name(), "stat"))
		wchan, _ := os.ReadFile(filepath.Join(dir, e.Name(), "wchan"))
		// stat: "tid (comm) S ppid … utime(14) stime(15)": comm may hold spaces.
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		comm := s[strings.IndexByte(s, '(')+1 : i]
		f := strings.Fields(s[i+1:])
		if len(f) < 13 {
			continue
		}
		fmt.Fprintf(&b, " %s[%s %s %s+%st]", comm, f[0], string(wchan), f[11], f[12])
	}
	return b.String()
}
