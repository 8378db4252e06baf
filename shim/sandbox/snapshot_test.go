package sandbox_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/hypervisor/control"
	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/sandbox/sandboxtest"
)

// startFake boots a sandbox on the in-process fake VMM and agent.
func startFake(t *testing.T) (*sandbox.Sandbox, *sandboxtest.VMM, *sandboxtest.Agent) {
	t.Helper()
	agent := sandboxtest.NewAgent()
	vmm := sandboxtest.NewVMM(agent)
	sb, err := sandbox.New(sandbox.Options{ID: "sb1", Dir: filepath.Join(t.TempDir(), "sb"), DiskSlots: 1,
		VMM: vmm, Dial: sandboxtest.Dialer(agent), BootTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Start(context.Background(), "/img/c1.ext4", "c1"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Stop(context.Background()) })
	return sb, vmm, agent
}

func TestSnapshotOneAtATime(t *testing.T) {
	sb, vmm, agent := startFake(t)
	ctx := context.Background()
	dir := t.TempDir()
	entered, release := make(chan struct{}), make(chan struct{})
	vmm.SnapshotFunc = func(ctx context.Context, d string, inc bool) (control.SnapshotResult, error) {
		close(entered)
		<-release
		return control.SnapshotResult{Dir: d, FrozenMS: 1.5}, nil
	}
	first := filepath.Join(dir, "a")
	done := make(chan error, 1)
	go func() {
		_, err := sb.Snapshot(ctx, sandbox.SnapshotOptions{Dir: first, What: "snapshot s1"})
		done <- err
	}()
	<-entered
	if got := sb.Busy(); got != "snapshot s1" {
		t.Fatalf("Busy() = %q while a snapshot runs", got)
	}
	// The second is refused at once, naming the first: never queued.
	start := time.Now()
	_, err := sb.Snapshot(ctx, sandbox.SnapshotOptions{Dir: filepath.Join(dir, "b")})
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "busy: snapshot s1 has been running since") {
		t.Fatalf("concurrent snapshot: %v, want unavailable naming the running one", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the refusal took %v", d)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if sb.Busy() != "" || sb.Base() != first {
		t.Fatalf("after the snapshot: busy %q, base %q", sb.Busy(), sb.Base())
	}
	// The running guest synced its filesystems once, before the VMM's op.
	if n := agent.CallCount("SyncFilesystems"); n != 1 {
		t.Fatalf("SyncFilesystems called %d times", n)
	}
	// The next one may run, incremental; the VMM is told so.
	vmm.SnapshotFunc = nil
	st, err := sb.Snapshot(ctx, sandbox.SnapshotOptions{Dir: filepath.Join(dir, "b"), Incremental: true})
	if err != nil {
		t.Fatal(err)
	}
	if st.Total <= 0 || len(vmm.Incremental) != 2 || !vmm.Incremental[1] {
		t.Fatalf("stats %+v, incremental calls %v", st, vmm.Incremental)
	}
}

func TestSnapshotFailureForgetsTheBase(t *testing.T) {
	sb, vmm, _ := startFake(t)
	ctx := context.Background()
	dir := t.TempDir()
	if _, err := sb.Snapshot(ctx, sandbox.SnapshotOptions{Dir: filepath.Join(dir, "a")}); err != nil {
		t.Fatal(err)
	}
	vmm.SnapshotErr = &control.RefusedError{Op: "snapshot", Reason: "incremental snapshot: no parent"}
	_, err := sb.Snapshot(ctx, sandbox.SnapshotOptions{Dir: filepath.Join(dir, "b"), Incremental: true})
	var refused *control.RefusedError
	if !errors.As(err, &refused) || !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("refused snapshot: %v (%T)", err, err)
	}
	// The VMM forgets its parent when a snapshot fails: so does the sandbox.
	if sb.Base() != "" || sb.Busy() != "" {
		t.Fatalf("after a failure: base %q, busy %q", sb.Base(), sb.Busy())
	}
	sb.Stop(ctx)
	if _, err := sb.Snapshot(ctx, sandbox.SnapshotOptions{Dir: filepath.Join(dir, "c")}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("snapshot of a stopped sandbox: %v", err)
	}
}

// A snapshot of a sandbox with a host directory shared is taken (cube-vmm
// carries the guest's FUSE session) and records the share beside the VM
// snapshot, for a restore to re-bind.
func TestSnapshotRecordsShares(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to bind-mount (the root tier runs it)")
	}
	sb, _, _ := startFake(t)
	ctx := context.Background()
	src := t.TempDir()
	guest, err := sb.ShareHostDir(ctx, sandbox.ShareRequest{Source: src, ReadOnly: true, Ref: "host directory " + src + " at /data",
		Container: "c1", Destination: "/data"})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	if _, err := sb.Snapshot(ctx, sandbox.SnapshotOptions{Dir: dir}); err != nil {
		t.Fatalf("snapshot with a host directory shared: %v", err)
	}
	recs, err := sandbox.ReadShares(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := sandbox.ShareRecord{Name: "v1", Host: src, ReadOnly: true, Container: "c1", Destination: "/data", Ref: "host directory " + src + " at /data"}
	if len(recs) != 1 || recs[0] != want || guest != "/run/cube/shared/v1" {
		t.Fatalf("recorded %+v (guest %s), want %+v", recs, guest, want)
	}
	// Unshared, the next snapshot records nothing.
	if err := sb.UnshareHostDir(guest); err != nil {
		t.Fatal(err)
	}
	dir2 := filepath.Join(t.TempDir(), "snap2")
	if _, err := sb.Snapshot(ctx, sandbox.SnapshotOptions{Dir: dir2}); err != nil {
		t.Fatal(err)
	}
	if recs, err := sandbox.ReadShares(dir2); err != nil || recs != nil {
		t.Errorf("snapshot without shares records %+v, %v", recs, err)
	}
}
