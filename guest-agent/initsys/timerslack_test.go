package initsys

import (
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// SetProcessTimerSlack changes the calling thread's slack at least (the
// other threads' need CAP_SYS_NICE) and the value reads back.
func TestSetProcessTimerSlack(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(before), 0, 0, 0)
	err = SetProcessTimerSlack(AgentTimerSlack)
	if err != nil && os.Geteuid() == 0 {
		t.Fatalf("as root: %v", err)
	}
	got, err2 := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err2 != nil || got != AgentTimerSlack {
		t.Fatalf("this thread's slack = %d (%v), want %d (set: %v)", got, err2, AgentTimerSlack, err)
	}
	if os.Geteuid() == 0 {
		b, err := os.ReadFile("/proc/self/timerslack_ns")
		if err != nil || string(b) != "4000000\n" {
			t.Fatalf("main thread's timerslack_ns = %q (%v)", b, err)
		}
	}
}
