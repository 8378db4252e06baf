// Package procstat reads what a liveness check needs from /proc/PID/stat:
// the process's state and its start time. A pid and its start time name
// one process for the life of a boot (a reused pid has another start time),
// which is how the shim's standby VMs and the checkpoint store's and fork's
// records tell their process from a stranger with the same pid. It imports
// nothing of ours.
package procstat

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Stat is a process's state (field 3: 'R', 'S', 'Z', …) and start time
// (field 22: clock ticks since boot).
type Stat struct {
	State byte
	Start uint64
}

// Exited says whether the process has ended and is only a zombie (or dead
// and about to go).
func (s Stat) Exited() bool { return s.State == 'Z' || s.State == 'X' }

// Read reads /proc/PID/stat; the error wraps fs.ErrNotExist when there is
// no such process.
func Read(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, err
	}
	return Parse(b)
}

// Parse parses a /proc/PID/stat line: "pid (comm) state ppid …". comm may
// hold anything, spaces and parentheses included, so the fields are
// counted after its last ')'.
func Parse(b []byte) (Stat, error) {
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return Stat{}, errors.New("/proc stat: no ')'")
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state), so field 22 (starttime) is f[19].
	if len(f) < 20 || len(f[0]) != 1 {
		return Stat{}, errors.New("/proc stat: too few fields")
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return Stat{}, fmt.Errorf("/proc stat: start time: %w", err)
	}
	return Stat{State: f[0][0], Start: start}, nil
}
