package cubetest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
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
