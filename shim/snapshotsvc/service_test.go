package snapshotsvc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cube-runtime/cube/hypervisor/control"
	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/sandbox/sandboxtest"
	api "github.com/cube-runtime/cube/shim/snapshotapi"
)

// sandboxes maps container ids to one fake VM, as the task service does.
type sandboxes struct {
	sb         *sandbox.Sandbox
	containers map[string]bool
}

func (s *sandboxes) SandboxOf(id string) (*sandbox.Sandbox, error) {
	if !s.containers[id] {
		return nil, fmt.Errorf("container %s: %w in this shim", id, errdefs.ErrNotFound)
	}
	return s.sb, nil
}

type harness struct {
	ctx    context.Context
	vmm    *sandboxtest.VMM
	agent  *sandboxtest.Agent
	client api.SnapshotsService
	dir    string // where snapshots go
}

// newHarness serves the service over a real ttrpc socket, on a fake VM
// running containers c1 and c2.
func newHarness(t *testing.T) *harness { return newNetHarness(t, nil) }

// newNetHarness is newHarness with a sandbox network (nil: none).
func newNetHarness(t *testing.T, network sandbox.Network) *harness {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	h := &harness{ctx: ctx, agent: sandboxtest.NewAgent(), dir: t.TempDir()}
	h.vmm = sandboxtest.NewVMM(h.agent)
	sb, err := sandbox.New(sandbox.Options{ID: "sb1", Dir: filepath.Join(t.TempDir(), "sb"), DiskSlots: 2,
		VMM: h.vmm, Dial: sandboxtest.Dialer(h.agent), BootTimeout: time.Second, Network: network})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Start(ctx, "/img/c1.ext4", "c1"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Stop(context.Background()) })
	svc := New(Options{Namespace: "ns1", Sandboxes: &sandboxes{sb: sb, containers: map[string]bool{"c1": true, "c2": true}}})
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.RegisterTTRPC(srv); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "s.sock"))
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(context.Background(), l)
	t.Cleanup(func() { srv.Close() })
	conn, err := net.Dial("unix", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := ttrpc.NewClient(conn)
	t.Cleanup(func() { c.Close() })
	h.client = api.NewSnapshotsClient(c)
	return h
}

func (h *harness) snapshot(t *testing.T, container, name string, incremental bool) *api.Snapshot {
	t.Helper()
	r, err := h.client.Snapshot(h.ctx, &api.SnapshotRequest{ContainerId: container, Dir: filepath.Join(h.dir, name),
		Incremental: incremental, Id: "id-" + name, Names: []string{name}})
	if err != nil {
		t.Fatalf("snapshot %s: %v", name, err)
	}
	return r.Snapshot
}

func wantCode(t *testing.T, err error, code codes.Code, substr string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(err.Error(), substr) {
		t.Fatalf("error %v: want %v containing %q", err, code, substr)
	}
}

func TestSnapshotListInspect(t *testing.T) {
	h := newHarness(t)
	h.vmm.SnapshotFunc = func(ctx context.Context, dir string, inc bool) (control.SnapshotResult, error) {
		return control.SnapshotResult{Dir: dir, FrozenMS: 12.5, TotalMS: 40, PrecopyMS: 20, MemoryBytes: 1 << 20, DiskBytes: 4096, Reflinked: true}, nil
	}
	s1 := h.snapshot(t, "c1", "s1", false)
	if s1.Id != "id-s1" || s1.Names[0] != "s1" || s1.SandboxId != "sb1" || s1.Namespace != "ns1" || s1.ContainerId != "c1" ||
		s1.Dir != filepath.Join(h.dir, "s1") || s1.Incremental || !s1.Base || s1.VmmPid == 0 || s1.StartedUnixNano == 0 {
		t.Fatalf("snapshot s1: %+v", s1)
	}
	if tm, sz := s1.Timings, s1.Sizes; tm.FrozenMs != 12.5 || tm.VmmTotalMs != 40 || tm.PrecopyMs != 20 || tm.TotalMs <= 0 ||
		sz.MemoryBytes != 1<<20 || sz.DiskBytes != 4096 || !sz.Reflinked {
		t.Fatalf("figures: %+v %+v", tm, sz)
	}
	// Any container of the sandbox names the same VM.
	s2 := h.snapshot(t, "c2", "s2", true)
	if !s2.Incremental || !s2.Base || len(h.vmm.Incremental) != 2 || !h.vmm.Incremental[1] {
		t.Fatalf("incremental s2: %+v; vmm calls %v", s2, h.vmm.Incremental)
	}
	l, err := h.client.List(h.ctx, &api.ListRequest{ContainerId: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if l.SandboxId != "sb1" || l.Busy != "" || len(l.Snapshots) != 2 || l.Snapshots[0].Id != "id-s1" || l.Snapshots[0].Base || !l.Snapshots[1].Base {
		t.Fatalf("list: %+v", l)
	}
	for _, ref := range []string{"s1", "id-s1", filepath.Join(h.dir, "s1")} {
		r, err := h.client.Inspect(h.ctx, &api.InspectRequest{ContainerId: "c2", Ref: ref})
		if err != nil || r.Snapshot.Id != "id-s1" || r.Snapshot.Base {
			t.Fatalf("inspect %s: %+v %v", ref, r, err)
		}
	}
	_, err = h.client.Inspect(h.ctx, &api.InspectRequest{ContainerId: "c1", Ref: "s3"})
	wantCode(t, err, codes.NotFound, `no snapshot "s3" among the 2`)
}

func TestSnapshotBusyIsRefusedAtOnce(t *testing.T) {
	h := newHarness(t)
	entered, release := make(chan struct{}), make(chan struct{})
	h.vmm.SnapshotFunc = func(ctx context.Context, dir string, inc bool) (control.SnapshotResult, error) {
		close(entered)
		<-release
		return control.SnapshotResult{Dir: dir}, nil
	}
	done := make(chan error, 1)
	go func() {
		_, err := h.client.Snapshot(h.ctx, &api.SnapshotRequest{ContainerId: "c1", Dir: filepath.Join(h.dir, "a"), Id: "id-a", Names: []string{"first"}})
		done <- err
	}()
	<-entered
	start := time.Now()
	_, err := h.client.Snapshot(h.ctx, &api.SnapshotRequest{ContainerId: "c2", Dir: filepath.Join(h.dir, "b")})
	wantCode(t, err, codes.Unavailable, `sandbox sb1 is busy: snapshot "first" (of container c1) into `+filepath.Join(h.dir, "a"))
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("refused after %v: queued?", d)
	}
	l, err := h.client.List(h.ctx, &api.ListRequest{ContainerId: "c1"})
	if err != nil || !strings.HasPrefix(l.Busy, `snapshot "first"`) {
		t.Fatalf("list while busy: %+v %v", l, err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Free again.
	h.vmm.SnapshotFunc = nil
	h.snapshot(t, "c1", "c", false)
}

func TestSnapshotRefusals(t *testing.T) {
	h := newHarness(t)
	for _, req := range []*api.SnapshotRequest{
		{ContainerId: "c1", Dir: "rel/dir"},
		{ContainerId: "c1", Dir: h.dir + "/x/../y"},
		{ContainerId: "c1"},
		{Dir: h.dir + "/z"},
		{ContainerId: "c1", Dir: h.dir + "/z", Names: []string{""}},
	} {
		_, err := h.client.Snapshot(h.ctx, req)
		wantCode(t, err, codes.InvalidArgument, "snapshot of")
	}
	_, err := h.client.Snapshot(h.ctx, &api.SnapshotRequest{ContainerId: "nope", Dir: h.dir + "/z"})
	wantCode(t, err, codes.NotFound, "nope")
	_, err = h.client.List(h.ctx, &api.ListRequest{ContainerId: "nope"})
	wantCode(t, err, codes.NotFound, "list snapshots of nope")
	// A VMM failure is the caller's to clean up after (it owns the
	// directory); the shim records nothing.
	h.vmm.SnapshotErr = errors.New("disk full")
	_, err = h.client.Snapshot(h.ctx, &api.SnapshotRequest{ContainerId: "c1", Dir: h.dir + "/z"})
	wantCode(t, err, codes.Unknown, "disk full")
	h.vmm.SnapshotErr = &control.RefusedError{Op: "snapshot", Reason: "incremental snapshot: no parent (take a full snapshot first)"}
	_, err = h.client.Snapshot(h.ctx, &api.SnapshotRequest{ContainerId: "c1", Dir: h.dir + "/z", Incremental: true})
	wantCode(t, err, codes.FailedPrecondition, "take a full snapshot first")
	if l, err := h.client.List(h.ctx, &api.ListRequest{ContainerId: "c1"}); err != nil || len(l.Snapshots) != 0 {
		t.Fatalf("list after failures: %+v %v", l, err)
	}
}
