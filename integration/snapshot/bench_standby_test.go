package snapshot

import (
	"context"
	"fmt"
	"path/filepath"
	"time"
)

// restoreStandbyErr is the restore latency of a standby cube-vmm (`cube-vmm restore -standby`, started and
// waiting beforehand, not timed): the restore op sent → its answer, which comes once the VM runs. Errors are
// classified as the other control ops' (ctlDo).
func restoreStandbyErr(dir, snap string) (time.Duration, error) {
	sock := filepath.Join(dir, "cube-standby.sock")
	p, err := startProcErr(cubeVMM, "restore", "-standby", "-control", sock, "-console", "none")
	if err != nil {
		return 0, err
	}
	defer p.kill()
	ctl, err := dialControlErr(p, sock, time.Minute)
	if err != nil {
		return 0, err
	}
	v := &cubeVM{p: p, ctl: ctl}
	var info struct {
		State string `json:"state"`
	}
	if err := v.ctlDo("standby info", func() error { return ctl.Info(context.Background(), &info) }); err != nil {
		v.abandon()
		return 0, err
	}
	if info.State != "standby" {
		v.abandon()
		return 0, fmt.Errorf("standby cube-vmm: state %q, want standby\n%s", info.State, p.tail())
	}
	var d time.Duration
	err = v.ctlDo("standby restore "+snap, func() error {
		t0 := time.Now()
		_, err := ctl.Restore(context.Background(), snap, false)
		d = time.Since(t0)
		return err
	})
	if err == nil {
		err = v.ctlDo("info after the standby restore", func() error { return ctl.Info(context.Background(), &info) })
	}
	if err == nil && info.State != "running" {
		err = fmt.Errorf("after the standby restore: state %q, want running\n%s", info.State, p.tail())
	}
	if err != nil {
		v.abandon()
		return 0, err
	}
	return d, v.stopErr()
}
