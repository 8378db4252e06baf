package initsys

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// AgentTimerSlack is the timer slack of the agent and its container
// helpers: a timer of theirs may fire up to this much late, so the kernel
// runs it with the scheduler tick (4 ms at Debian's HZ=250) instead of
// programming the guest's timer for it. A Go runtime asleep for
// microseconds at a time (sysmon, timed futex waits) otherwise makes each
// busy moment cost a timer interrupt per wake-up: in a nested guest each is
// an exit to the host (a timer write, the host's interrupt, an interrupt
// window), and those were about half of a container start's exits.
// Container processes get Linux's default back before their exec
// (package container, containerTimerSlack).
const AgentTimerSlack = 4_000_000 // ns

// SetProcessTimerSlack sets the timer slack of every thread of this
// process to ns: threads created later inherit it from the thread that
// creates them. Writing another thread's slack needs CAP_SYS_NICE, so as
// non-root only the calling thread's changes (and the error says so).
func SetProcessTimerSlack(ns int) error {
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(ns), 0, 0, 0); err != nil {
		return fmt.Errorf("timer slack of this thread: %w", err)
	}
	tids, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fmt.Errorf("timer slack: list threads: %w", err)
	}
	v := []byte(strconv.Itoa(ns))
	for _, t := range tids {
		// The per-thread file lives in /proc/<tid>, not /proc/self/task/<tid>.
		if err := os.WriteFile(filepath.Join("/proc", t.Name(), "timerslack_ns"), v, 0); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("timer slack of thread %s: %w", t.Name(), err)
		}
	}
	return nil
}
