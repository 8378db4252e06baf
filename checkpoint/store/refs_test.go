package store_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/checkpoint/store"
	"github.com/cube-runtime/cube/checkpoint/store/storetest"
)

func TestDeleteRefusedWhileReferenced(t *testing.T) {
	root := t.TempDir()
	s, _ := open(t, root)
	snap := take(t, s, "sb1", "base")
	vmm := exec.Command("sleep", "60") // stands for the VMM that maps the snapshot
	if err := vmm.Start(); err != nil {
		t.Fatal(err)
	}
	defer vmm.Process.Kill()
	if err := s.Acquire(ctx, "base", store.Holder{Name: "sandbox sb2", PID: vmm.Process.Pid}); err != nil {
		t.Fatal(err)
	}
	if err := s.Acquire(ctx, snap.ID, store.Holder{Name: "fork f1 clone 1"}); err != nil {
		t.Fatal(err)
	}
	err := s.Delete(ctx, "base")
	wantErr(t, err, errdefs.IsFailedPrecondition, "snapshot "+snap.ID+" (base) is in use", `"sandbox sb2" (pid `+strconv.Itoa(vmm.Process.Pid), `"fork f1 clone 1" (pid `+strconv.Itoa(os.Getpid()), "Release", "stop the VM")

	got, err := s.Get(ctx, snap.ID)
	if err != nil || len(got.Holders) != 2 || got.Holders[0].Holder != "sandbox sb2" || got.Holders[0].Stale {
		t.Fatalf("holders %+v %v", got.Holders, err)
	}
	// References are on disk: another Store (a restarted shim) sees them.
	s2, _ := open(t, root)
	wantErr(t, s2.Delete(ctx, snap.ID), errdefs.IsFailedPrecondition, "sandbox sb2")

	if err := s.Release(ctx, snap.ID, "fork f1 clone 1"); err != nil {
		t.Fatal(err)
	}
	wantErr(t, s.Release(ctx, snap.ID, "fork f1 clone 1"), errdefs.IsNotFound, `holder "fork f1 clone 1" holds no reference`)
	// Acquiring again replaces the reference: one Release drops it.
	s.Acquire(ctx, snap.ID, store.Holder{Name: "sandbox sb2", PID: vmm.Process.Pid})
	if err := s.Release(ctx, "base", "sandbox sb2"); err != nil {
		t.Fatal(err)
	}
	if err := s2.Delete(ctx, "base"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{snap.Dir, filepath.Join(root, "names", "base"), filepath.Join(root, "refs", snap.ID)} {
		if exists(p) {
			t.Errorf("%s left after Delete", p)
		}
	}
	wantErr(t, s.Delete(ctx, snap.ID), errdefs.IsNotFound, snap.ID)
}

func TestAcquireRefusals(t *testing.T) {
	s, _ := open(t, t.TempDir())
	snap := take(t, s, "sb1")
	wantErr(t, s.Acquire(ctx, "nosuch", store.Holder{Name: "h"}), errdefs.IsNotFound, `"nosuch"`)
	wantErr(t, s.Acquire(ctx, snap.ID, store.Holder{}), errdefs.IsInvalidArgument, "holder is empty")
	wantErr(t, s.Acquire(ctx, snap.ID, store.Holder{Name: "h", PID: 1 << 22}), errdefs.IsInvalidArgument, "no such process", "pid of the running VMM")
}

func TestDeleteRefusedParent(t *testing.T) {
	s, _ := open(t, t.TempDir())
	full := take(t, s, "sb1", "full")
	inc := takeOver(t, s, full)
	lin := storetest.Take(t, s, store.BeginOptions{Sandbox: "sb1", Parent: full.ID}, false)
	err := s.Delete(ctx, "full")
	wantErr(t, err, errdefs.IsFailedPrecondition, "snapshot "+full.ID+" (full) is the parent of", inc.ID, lin.ID, "delete those first")

	// A child being written that named it at Begin protects it too.
	p, err := s.Begin(ctx, store.BeginOptions{Sandbox: "sb1", Parent: inc.ID})
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, s.Delete(ctx, inc.ID), errdefs.IsFailedPrecondition, "parent of "+p.ID(), "being written", "Commit or Abort")
	p.Abort(ctx)
	for _, id := range []string{inc.ID, lin.ID, full.ID} {
		if err := s.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

func TestStaleHolders(t *testing.T) {
	root := t.TempDir()
	s, hook := open(t, root)
	a := take(t, s, "sb1")
	b := take(t, s, "sb1")
	vmm := exec.Command("sleep", "60")
	if err := vmm.Start(); err != nil {
		t.Fatal(err)
	}
	if err := s.Acquire(ctx, a.ID, store.Holder{Name: "sandbox sb1", PID: vmm.Process.Pid}); err != nil {
		t.Fatal(err)
	}
	runCrash(t, "acquire", root, b.ID) // a process that took a reference and died
	vmm.Process.Kill()
	vmm.Wait()

	got, _ := s.Get(ctx, a.ID)
	if len(got.Holders) != 1 || !got.Holders[0].Stale {
		t.Fatalf("holders of a dead VMM: %+v", got.Holders)
	}
	// Delete drops a stale reference instead of refusing.
	if err := s.Delete(ctx, a.ID); err != nil {
		t.Fatalf("delete with a stale reference: %v", err)
	}
	if !logged(hook, "dropped the reference of a process that is gone", "sandbox sb1") {
		t.Error("the dropped reference is not logged")
	}
	rep, err := s.Collect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Removed) != 1 || !strings.Contains(rep.Removed[0], `reference of holder "crashed vmm" to snapshot `+b.ID) {
		t.Errorf("Collect removed %q", rep.Removed)
	}
	if exists(filepath.Join(root, "refs", b.ID)) {
		t.Error("the stale reference is left")
	}
}

func TestCorruptReferenceHolds(t *testing.T) {
	root := t.TempDir()
	s, _ := open(t, root)
	snap := take(t, s, "sb1")
	dir := filepath.Join(root, "refs", snap.ID)
	os.MkdirAll(dir, 0o700)
	bad := filepath.Join(dir, "0123.json")
	os.WriteFile(bad, []byte(`{"version":1,"holder":`), 0o600)
	// An unreadable reference may be a VM's: it holds, and says which file.
	wantErr(t, s.Delete(ctx, snap.ID), errdefs.IsFailedPrecondition, "unreadable reference file "+bad)
	if _, err := s.Collect(ctx); err != nil || !exists(bad) {
		t.Errorf("Collect: %v; file kept: %v", err, exists(bad))
	}
	os.Remove(bad)
	if err := s.Delete(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
}
