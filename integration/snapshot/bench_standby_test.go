package snapshot

import (
	"path/filepath"
	"testing"
	"time"
)

// restoreStandby is the restore latency of a standby cube-vmm (`cube-vmm restore -standby`, started and
// waiting beforehand, not timed): the restore op sent → its answer, which comes once the VM runs.
func restoreStandby(tb testing.TB, dir, snap string) time.Duration {
	tb.Helper()
	sock := filepath.Join(dir, "cube-standby.sock")
	p := startProc(tb, cubeVMM, "restore", "-standby", "-control", sock, "-console", "none")
	ctl := dialControl(tb, p, sock, time.Minute)
	var info struct {
		State string `json:"state"`
	}
	if err := ctl.Info(&info); err != nil || info.State != "standby" {
		tb.Fatalf("standby info: %q %v\n%s", info.State, err, p.tail())
	}
	t0 := time.Now()
	if _, err := ctl.Restore(snap, false); err != nil {
		tb.Fatalf("standby restore: %v\n%s", err, p.tail())
	}
	d := time.Since(t0)
	if err := ctl.Info(&info); err != nil || info.State != "running" {
		tb.Fatalf("after the standby restore: %q %v\n%s", info.State, err, p.tail())
	}
	ctl.Stop()
	ctl.Close()
	p.wait(tb, time.Minute)
	return d
}
