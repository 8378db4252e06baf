package sandbox_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/sandbox/sandboxtest"
)

// waitSyncs waits until the fake agent saw n SyncFilesystems calls.
func waitSyncs(t *testing.T, count func(string) int, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for count("SyncFilesystems") < n {
		if time.Now().After(deadline) {
			t.Fatalf("SyncFilesystems called %d times, want %d", count("SyncFilesystems"), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// A pre-sync that answered spares Stop its own sync.
func TestPreSyncSparesStopItsSync(t *testing.T) {
	sb, _, agent := startFake(t)
	sb.PreSync()
	waitSyncs(t, agent.CallCount, 1)
	if err := sb.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := agent.CallCount("SyncFilesystems"); n != 1 {
		t.Fatalf("SyncFilesystems called %d times: Stop synced again after the pre-sync", n)
	}
}

// A rootfs attached after the pre-sync voids it (that container writes
// after it): Stop syncs again.
func TestPreSyncVoidedByANewRootfs(t *testing.T) {
	agent := sandboxtest.NewAgent()
	sb, err := sandbox.New(sandbox.Options{ID: "sb1", Dir: filepath.Join(t.TempDir(), "sb"), DiskSlots: 2,
		VMM: sandboxtest.NewVMM(agent), Dial: sandboxtest.Dialer(agent), BootTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Start(context.Background(), "/img/c1.ext4", "c1"); err != nil {
		t.Fatal(err)
	}
	sb.PreSync()
	waitSyncs(t, agent.CallCount, 1)
	if _, err := sb.AttachRootfs(context.Background(), "c2", "/img/c2.ext4"); err != nil {
		t.Fatal(err)
	}
	if err := sb.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := agent.CallCount("SyncFilesystems"); n != 2 {
		t.Fatalf("SyncFilesystems called %d times, want 2 (the pre-sync, then Stop's own)", n)
	}
}

// A pre-sync that failed is not trusted: Stop syncs again.
func TestPreSyncFailedStopSyncsAgain(t *testing.T) {
	sb, _, agent := startFake(t)
	agent.SyncErrs = []error{errors.New("guest busy")}
	sb.PreSync()
	waitSyncs(t, agent.CallCount, 1)
	if err := sb.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := agent.CallCount("SyncFilesystems"); n != 2 {
		t.Fatalf("SyncFilesystems called %d times, want 2", n)
	}
}

// Without a pre-sync Stop syncs once, and PreSync on a stopped sandbox
// does nothing.
func TestStopSyncsWithoutPreSync(t *testing.T) {
	sb, _, agent := startFake(t)
	if err := sb.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	sb.PreSync()
	time.Sleep(10 * time.Millisecond)
	if n := agent.CallCount("SyncFilesystems"); n != 1 {
		t.Fatalf("SyncFilesystems called %d times, want 1", n)
	}
}
