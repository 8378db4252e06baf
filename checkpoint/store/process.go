package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"github.com/cube-runtime/cube/shim/procstat"
)

// Process identifies a process across pid reuse and reboots: its pid, its
// start time after boot (clock ticks, /proc/PID/stat field 22) and the boot
// it ran in (/proc/sys/kernel/random/boot_id). References and unfinished
// snapshots record the process they belong to; they are stale once it is gone.
type Process struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
	Boot  string `json:"boot"`
}

func (p Process) String() string { return "pid " + strconv.Itoa(p.PID) }

const procRoot = "/proc"

// readBootID returns the current boot's id.
func readBootID() (string, error) {
	b, err := os.ReadFile(procRoot + "/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("boot id: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if err := checkBoot(id); err != nil {
		return "", err
	}
	return id, nil
}

func checkBoot(id string) error {
	if id == "" || len(id) > 64 {
		return fmt.Errorf("boot id %q: 1 to 64 bytes", id)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || c == '-') {
			return fmt.Errorf("boot id %q: only hex digits and '-'", id)
		}
	}
	return nil
}

// checkProcess validates a recorded process (from a file).
func checkProcess(p Process) error {
	if p.PID < 1 || p.PID > 1<<22 {
		return fmt.Errorf("pid %d out of range", p.PID)
	}
	if p.Start == 0 {
		return fmt.Errorf("pid %d: no start time", p.PID)
	}
	return checkBoot(p.Boot)
}

// processOf identifies the running process pid.
func processOf(pid int, boot string) (Process, error) {
	st, err := procstat.Read(pid)
	if errors.Is(err, fs.ErrNotExist) {
		return Process{}, fmt.Errorf("pid %d: no such process", pid)
	}
	if err != nil {
		return Process{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	if st.Exited() {
		return Process{}, fmt.Errorf("pid %d has exited", pid)
	}
	return Process{PID: pid, Start: st.Start, Boot: boot}, nil
}

// alive says whether p still runs: same boot, a process with its pid and
// start time, not a zombie. When /proc cannot say (an error other than "no
// such process"), p counts as alive: a reference is dropped only when its
// process is known to be gone, never on a guess.
func (p Process) alive(boot string) bool {
	if p.Boot != boot {
		return false
	}
	st, err := procstat.Read(p.PID)
	if errors.Is(err, fs.ErrNotExist) {
		return false
	}
	if err != nil {
		return true
	}
	return st.Start == p.Start && !st.Exited()
}
