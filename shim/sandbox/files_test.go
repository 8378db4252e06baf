package sandbox_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/sandbox/sandboxtest"
)

// TestFilesNeedsARunningVMAndAFileAgent: before Start and while paused the
// files are refused (FailedPrecondition); an agent client without the file
// RPCs (the fake) is NotImplemented, not a crash.
func TestFilesNeedsARunningVMAndAFileAgent(t *testing.T) {
	agent := sandboxtest.NewAgent()
	vmm := sandboxtest.NewVMM(agent)
	sb, err := sandbox.New(sandbox.Options{ID: "sb1", Dir: filepath.Join(t.TempDir(), "sb"), DiskSlots: 1,
		VMM: vmm, Dial: sandboxtest.Dialer(agent), BootTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Files(); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("before Start: %v", err)
	}
	ctx := context.Background()
	if err := sb.Start(ctx, "/img/c1.ext4", "c1"); err != nil {
		t.Fatal(err)
	}
	defer sb.Stop(ctx)
	if _, err := sb.Files(); !errdefs.IsNotImplemented(err) {
		t.Errorf("a fake agent without file RPCs: %v", err)
	}
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Files(); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("paused: %v", err)
	}
}
