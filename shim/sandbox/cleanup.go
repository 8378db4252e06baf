package sandbox

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// Cleanup removes what a crashed shim left of a sandbox: it kills the VMM
// (only if the pid still names a VMM started for r.Dir: pids are reused),
// then removes the state dir and the cgroup.
func Cleanup(r Record) error {
	if r.VMMPid > 0 && isOurVMM(r.VMMPid, r.Dir) {
		if err := syscall.Kill(r.VMMPid, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
			return fmt.Errorf("kill vmm pid %d: %w", r.VMMPid, err)
		}
		// It is not our child (the shim that started it is gone), so poll
		// until the pid is gone or a zombie awaiting its new parent.
		for i := 0; i < 500 && isOurVMM(r.VMMPid, r.Dir); i++ {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if r.Dir != "" {
		// Ordering: host directories bound into the share first (see teardown).
		if err := ReleaseShareDir(r.Dir); err != nil {
			return fmt.Errorf("release the sandbox's virtio-fs share: %w", err)
		}
		if err := os.RemoveAll(r.Dir); err != nil {
			return fmt.Errorf("remove sandbox dir: %w", err)
		}
	}
	if r.Cgroup != "" {
		_ = RemoveCgroup(r.Cgroup)
	}
	return nil
}

// isOurVMM reports whether pid is a live (non-zombie) process whose command
// line mentions dir.
func isOurVMM(pid int, dir string) bool {
	if dir == "" {
		return false
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(cmdline) == 0 {
		return false // gone, or a zombie (empty cmdline)
	}
	return bytes.Contains(cmdline, []byte(dir))
}
