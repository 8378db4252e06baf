package standby

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// StartIdle starts cmd at SCHED_IDLE: the child is forked from a thread
// that has that policy for the moment (a fork inherits the forking
// thread's), so every thread the VMM makes has it too, and the standby's
// restore and guest run only on CPU time nobody else wants. Where the
// policy cannot be set, cmd starts at normal priority (idle reports false).
func StartIdle(cmd *exec.Cmd) (idle bool, err error) {
	runtime.LockOSThread()
	if err := setPolicy(0, unix.SCHED_IDLE); err != nil {
		runtime.UnlockOSThread()
		return false, cmd.Start()
	}
	err = cmd.Start()
	// Ordering: the thread goes back to normal before the runtime may
	// give it to another goroutine; if it cannot, it stays locked and
	// ends with this goroutine.
	if setPolicy(0, unix.SCHED_NORMAL) == nil {
		runtime.UnlockOSThread()
	}
	return true, err
}

// Normalize puts every thread of pid back to SCHED_NORMAL (an adopted
// standby's VMM works for a sandbox now). Threads the process creates
// meanwhile inherit from one already changed or are met by the next pass.
func Normalize(pid int) error {
	for pass := 0; pass < 3; pass++ {
		ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
		if err != nil {
			return fmt.Errorf("threads of vmm pid %d: %w", pid, err)
		}
		changed := 0
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			p, err := unix.SchedGetAttr(tid, 0)
			if errors.Is(err, unix.ESRCH) {
				continue // the thread ended
			}
			if err != nil {
				return fmt.Errorf("scheduling policy of vmm thread %d: %w", tid, err)
			}
			if p.Policy == unix.SCHED_NORMAL {
				continue
			}
			if err := setPolicy(tid, unix.SCHED_NORMAL); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("vmm thread %d back to normal scheduling: %w", tid, err)
			}
			changed++
		}
		if changed == 0 {
			return nil
		}
	}
	return nil
}

func setPolicy(tid int, policy uint32) error {
	return unix.SchedSetAttr(tid, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: policy}, 0)
}
