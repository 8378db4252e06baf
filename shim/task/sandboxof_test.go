package task

import (
	"context"
	"testing"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"

	"github.com/cube-runtime/cube/hypervisor/control"
	"github.com/cube-runtime/cube/shim/sandbox"
)

// TestSandboxOfSharesTheSnapshotGuard: the snapshot service finds the VM
// through SandboxOf, and its snapshots and containerd's task Checkpoint share
// the sandbox's one-at-a-time guard.
func TestSandboxOfSharesTheSnapshotGuard(t *testing.T) {
	h := newHarness(t)
	if _, err := h.svc.SandboxOf("c1"); !errdefs.IsNotFound(err) {
		t.Fatalf("before create: %v", err)
	}
	h.create("c1", []string{"sleep", "100"}, nil, nil)
	h.start("c1", "")
	sb, err := h.svc.SandboxOf("c1")
	if err != nil || sb.ID() != "c1" {
		t.Fatalf("SandboxOf(c1) = %v, %v", sb, err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	h.vmm.SnapshotFunc = func(ctx context.Context, dir string, inc bool) (control.SnapshotResult, error) {
		close(entered)
		<-release
		return control.SnapshotResult{Dir: dir}, nil
	}
	done := make(chan error, 1)
	go func() {
		_, err := sb.Snapshot(h.ctx, sandbox.SnapshotOptions{Dir: t.TempDir() + "/s", What: "snapshot s1"})
		done <- err
	}()
	<-entered
	_, err = h.svc.Checkpoint(h.ctx, &taskAPI.CheckpointTaskRequest{ID: "c1", Path: t.TempDir()})
	wantCode(t, err, codes.Unavailable, "busy: snapshot s1 has been running")
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
