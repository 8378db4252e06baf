package snapshots

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"

	"github.com/cube-runtime/cube/checkpoint/store"
	"github.com/cube-runtime/cube/checkpoint/store/storetest"
	"github.com/cube-runtime/cube/hypervisor/control"
	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/sandbox/sandboxtest"
	"github.com/cube-runtime/cube/shim/snapshotapi"
	"github.com/cube-runtime/cube/shim/snapshotsvc"
)

type oneSandbox struct{ sb *sandbox.Sandbox }

func (o oneSandbox) SandboxOf(id string) (*sandbox.Sandbox, error) {
	if id != "c1" {
		return nil, fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	return o.sb, nil
}

// native turns the service's gRPC status errors back into errdefs classes, as
// a ttrpc client sees them.
type native struct{ s *snapshotsvc.Service }

func (n native) Snapshot(ctx context.Context, r *snapshotapi.SnapshotRequest) (*snapshotapi.SnapshotResponse, error) {
	resp, err := n.s.Snapshot(ctx, r)
	return resp, errgrpc.ToNative(err)
}

func (n native) List(ctx context.Context, r *snapshotapi.ListRequest) (*snapshotapi.ListResponse, error) {
	resp, err := n.s.List(ctx, r)
	return resp, errgrpc.ToNative(err)
}

type harness struct {
	ctx context.Context
	st  *store.Store
	vmm *sandboxtest.VMM
	sh  Shim

	mu   sync.Mutex
	last string // the fake VM's last snapshot, parent of an incremental one
}

// newHarness is a real store and the shim's real snapshot service on a fake
// VM whose VMM writes synthetic VM snapshots in cube-vmm's format.
func newHarness(t *testing.T) *harness {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	st, err := store.Open(ctx, t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	agent := sandboxtest.NewAgent()
	h := &harness{ctx: ctx, st: st, vmm: sandboxtest.NewVMM(agent)}
	h.vmm.SnapshotFunc = h.write
	sb, err := sandbox.New(sandbox.Options{ID: "c1", Dir: filepath.Join(t.TempDir(), "sb"), DiskSlots: 1,
		VMM: h.vmm, Dial: sandboxtest.Dialer(agent), BootTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Start(ctx, "/img/c1.ext4", "c1"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Stop(context.Background()) })
	h.sh = native{snapshotsvc.New(snapshotsvc.Options{Namespace: "ns1", Sandboxes: oneSandbox{sb}})}
	return h
}

func (h *harness) write(ctx context.Context, dir string, incremental bool) (control.SnapshotResult, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	parent := ""
	if incremental {
		if h.last == "" {
			return control.SnapshotResult{}, &control.RefusedError{Op: "snapshot", Reason: "incremental snapshot: no parent (take a full snapshot first)"}
		}
		parent = h.last
	}
	if err := storetest.Write(dir, parent); err != nil {
		return control.SnapshotResult{}, err
	}
	h.last = dir
	return control.SnapshotResult{Dir: dir, FrozenMS: 3, TotalMS: 9, MemoryBytes: storetest.MemoryMiB << 20}, nil
}

func (h *harness) take(t *testing.T, name string, incremental bool) Taken {
	t.Helper()
	tk, err := Take(h.ctx, h.st, h.sh, Options{Container: "c1", Sandbox: SandboxKey("ns1", "c1"), Names: []string{name}, Incremental: incremental})
	if err != nil {
		t.Fatalf("take %s: %v", name, err)
	}
	return tk
}

// wantClean checks that the store holds exactly ids, and nothing pending.
func (h *harness) wantClean(t *testing.T, ids ...string) {
	t.Helper()
	list, _, err := h.st.List(h.ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != len(ids) {
		t.Fatalf("store lists %d snapshots, want %d", len(list), len(ids))
	}
	for _, d := range []struct {
		dir string
		n   int
	}{{"snapshots", len(ids)}, {"pending", 0}} {
		ents, err := os.ReadDir(filepath.Join(h.st.Root(), d.dir))
		if err != nil || len(ents) != d.n {
			t.Fatalf("%s/ holds %d entries (%v), want %d", d.dir, len(ents), err, d.n)
		}
	}
}

func TestTakeFullThenIncremental(t *testing.T) {
	h := newHarness(t)
	s1 := h.take(t, "s1", false)
	if s1.Snapshot.Kind != store.Full || s1.Snapshot.Sandbox != "ns1/c1" || strings.Join(s1.Snapshot.Names, ",") != "s1" ||
		s1.Snapshot.Size <= 0 || s1.VM.Id != s1.Snapshot.ID || s1.VM.Dir != s1.Snapshot.Dir || s1.VM.Timings.FrozenMs != 3 {
		t.Fatalf("s1: %+v / %+v", s1.Snapshot, s1.VM)
	}
	s2 := h.take(t, "s2", true)
	if s2.Snapshot.Kind != store.Incremental || s2.Snapshot.Parent != s1.Snapshot.ID || !s2.VM.Incremental || !s2.VM.Base {
		t.Fatalf("s2: %+v / %+v", s2.Snapshot, s2.VM)
	}
	h.wantClean(t, s1.Snapshot.ID, s2.Snapshot.ID)
}

func TestTakeFailuresLeaveNothing(t *testing.T) {
	h := newHarness(t)
	s1 := h.take(t, "s1", false)
	// The VMM fails before writing.
	h.vmm.SnapshotErr = errors.New("no space left on device")
	_, err := Take(h.ctx, h.st, h.sh, Options{Container: "c1", Sandbox: "ns1/c1", Names: []string{"s2"}})
	if err == nil || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("vmm failure: %v", err)
	}
	h.wantClean(t, s1.Snapshot.ID)
	h.vmm.SnapshotErr = nil
	// The VMM writes, then fails.
	h.vmm.SnapshotFunc = func(ctx context.Context, dir string, inc bool) (control.SnapshotResult, error) {
		if err := storetest.Write(dir, ""); err != nil {
			return control.SnapshotResult{}, err
		}
		return control.SnapshotResult{}, errors.New("lost the reply")
	}
	if _, err := Take(h.ctx, h.st, h.sh, Options{Container: "c1", Sandbox: "ns1/c1", Names: []string{"s2"}}); err == nil {
		t.Fatal("a failure after the write: want an error")
	}
	h.wantClean(t, s1.Snapshot.ID)
	// The VMM answers but wrote no VM snapshot the store accepts.
	h.vmm.SnapshotFunc = func(ctx context.Context, dir string, inc bool) (control.SnapshotResult, error) {
		return control.SnapshotResult{Dir: dir}, os.Mkdir(dir, 0o700)
	}
	_, err = Take(h.ctx, h.st, h.sh, Options{Container: "c1", Sandbox: "ns1/c1", Names: []string{"s2"}})
	if err == nil || !strings.Contains(err.Error(), "the store refused it") {
		t.Fatalf("commit refused: %v", err)
	}
	h.wantClean(t, s1.Snapshot.ID)
	// The name was released each time.
	h.vmm.SnapshotFunc = h.write
	h.take(t, "s2", false)
}

func TestTakeBusyIsRefusedAndAborted(t *testing.T) {
	h := newHarness(t)
	entered, release := make(chan struct{}), make(chan struct{})
	h.vmm.SnapshotFunc = func(ctx context.Context, dir string, inc bool) (control.SnapshotResult, error) {
		close(entered)
		<-release
		return h.write(ctx, dir, inc)
	}
	done := make(chan error, 1)
	go func() {
		_, err := Take(h.ctx, h.st, h.sh, Options{Container: "c1", Sandbox: "ns1/c1", Names: []string{"first"}})
		done <- err
	}()
	<-entered
	_, err := Take(h.ctx, h.st, h.sh, Options{Container: "c1", Sandbox: "ns1/c1", Names: []string{"second"}})
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), `busy: snapshot "first"`) {
		t.Fatalf("concurrent take: %v", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	list, _, _ := h.st.List(h.ctx, store.ListOptions{})
	if len(list) != 1 || list[0].Names[0] != "first" {
		t.Fatalf("store after a refused take: %+v", list)
	}
}

func TestIncrementalNeedsABaseInTheStore(t *testing.T) {
	h := newHarness(t)
	_, err := Take(h.ctx, h.st, h.sh, Options{Container: "c1", Sandbox: "ns1/c1", Incremental: true})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "take a full snapshot first") {
		t.Fatalf("incremental without a base: %v", err)
	}
	if len(h.vmm.Snapshots) != 0 {
		t.Fatal("the VM was snapshotted")
	}
	s1 := h.take(t, "s1", false)
	if err := h.st.Delete(h.ctx, s1.Snapshot.ID); err != nil {
		t.Fatal(err)
	}
	_, err = Take(h.ctx, h.st, h.sh, Options{Container: "c1", Sandbox: "ns1/c1", Incremental: true})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "is not in the store") {
		t.Fatalf("incremental on a deleted base: %v", err)
	}
	h.wantClean(t)
}
