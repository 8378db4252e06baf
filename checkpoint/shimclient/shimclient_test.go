package shimclient

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/ttrpc"

	"github.com/cube-runtime/cube/shim/manager"
	api "github.com/cube-runtime/cube/shim/snapshotapi"
	"github.com/cube-runtime/cube/shim/task"
)

// The constants repeat the shim's (checkpoint/ imports only the shim's API).
func TestConstantsAreTheShims(t *testing.T) {
	if RuntimeName != manager.RuntimeName || SandboxIDAnnotation != task.SandboxIDAnnotation {
		t.Fatalf("RuntimeName %q / %q, SandboxIDAnnotation %q / %q", RuntimeName, manager.RuntimeName, SandboxIDAnnotation, task.SandboxIDAnnotation)
	}
	for _, ann := range []map[string]string{nil, {SandboxIDAnnotation: "pod"}} {
		if g, want := Group("app", ann), manager.GroupID("app", ann); g != want {
			t.Fatalf("Group = %q, the shim's %q", g, want)
		}
	}
}

// SocketAddress is the address pkg/shim derives.
func TestSocketAddressIsPkgShims(t *testing.T) {
	ctx := namespaces.WithNamespace(context.Background(), "ns1")
	want, err := shim.CreateSocketAddress(ctx, "/st/s", "/run/containerd/containerd.sock", "pod1", false)
	if err != nil {
		t.Fatal(err)
	}
	if got := SocketAddress("/st", "/run/containerd/containerd.sock", "ns1", "pod1"); got != want {
		t.Fatalf("SocketAddress %s, pkg/shim %s", got, want)
	}
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestReadAddress(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadAddress(dir); !errdefs.IsNotFound(err) {
		t.Fatalf("empty bundle: %v", err)
	}
	writeFile(t, filepath.Join(dir, "address"), "unix:///old.sock\n")
	if a, err := ReadAddress(dir); err != nil || a != "unix:///old.sock" {
		t.Fatalf("address file: %q %v", a, err)
	}
	// containerd 2's bootstrap.json wins.
	writeFile(t, filepath.Join(dir, "bootstrap.json"), `{"version":3,"address":"unix:///run/containerd/s/ab","protocol":"ttrpc"}`)
	if a, err := ReadAddress(dir); err != nil || a != "unix:///run/containerd/s/ab" {
		t.Fatalf("bootstrap.json: %q %v", a, err)
	}
	writeFile(t, filepath.Join(dir, "bootstrap.json"), `{"version":3,"address":"x","protocol":"grpc"}`)
	if _, err := ReadAddress(dir); !errdefs.IsNotImplemented(err) {
		t.Fatalf("grpc shim: %v", err)
	}
	writeFile(t, filepath.Join(dir, "bootstrap.json"), `{"version":`)
	if _, err := ReadAddress(dir); !errdefs.IsDataLoss(err) {
		t.Fatalf("truncated bootstrap.json: %v", err)
	}
}

func TestFind(t *testing.T) {
	state := t.TempDir()
	l := Locator{State: state, Address: "/run/containerd/containerd.sock", Namespace: "ns1"}
	// A pod member without a bundle file of its own uses its sandbox's.
	writeFile(t, filepath.Join(TaskDir(state, "ns1", "pod1"), "bootstrap.json"), `{"address":"unix:///pod.sock","protocol":"ttrpc"}`)
	if a, err := l.Find("app1", "pod1"); err != nil || a != "unix:///pod.sock" {
		t.Fatalf("pod member: %q %v", a, err)
	}
	// Nothing recorded: the derived socket, if it exists.
	_, err := l.Find("c1", "c1")
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "pass --state") || !strings.Contains(err.Error(), TaskDir(state, "ns1", "c1")) {
		t.Fatalf("no shim: %v", err)
	}
	sock := SocketAddress(state, l.Address, "ns1", "c1")
	writeFile(t, strings.TrimPrefix(sock, "unix://"), "")
	if a, err := l.Find("c1", "c1"); err != nil || a != sock {
		t.Fatalf("derived socket: %q %v", a, err)
	}
}

type fakeContainers map[string]Container

func (f fakeContainers) Container(ctx context.Context, id string) (Container, error) {
	c, ok := f[id]
	if !ok {
		return Container{}, fmt.Errorf("no container %s: %w", id, errdefs.ErrNotFound)
	}
	return c, nil
}

func TestResolve(t *testing.T) {
	state := t.TempDir()
	l := Locator{State: state, Namespace: "ns1"}
	writeFile(t, filepath.Join(TaskDir(state, "ns1", "c1"), "bootstrap.json"), `{"address":"unix:///c1.sock","protocol":"ttrpc"}`)
	cs := fakeContainers{
		"c1":   {ID: "c1", Runtime: RuntimeName, Group: "c1", Task: "running"},
		"runc": {ID: "runc", Runtime: "io.containerd.runc.v2", Group: "runc", Task: "running"},
		"idle": {ID: "idle", Runtime: RuntimeName, Group: "idle"},
	}
	ctx := context.Background()
	if tg, err := Resolve(ctx, cs, l, "c1"); err != nil || tg.Address != "unix:///c1.sock" || tg.Container.Group != "c1" {
		t.Fatalf("c1: %+v %v", tg, err)
	}
	for id, want := range map[string]string{"runc": "runs with runtime io.containerd.runc.v2", "idle": "has no task: start it first", "nope": "no container nope"} {
		if _, err := Resolve(ctx, cs, l, id); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: %v, want %q", id, err, want)
		}
	}
}

type listOnly struct{ api.SnapshotsService }

func (listOnly) List(ctx context.Context, r *api.ListRequest) (*api.ListResponse, error) {
	return &api.ListResponse{SandboxId: "sb-of-" + r.ContainerId}, nil
}

func (listOnly) Snapshot(ctx context.Context, r *api.SnapshotRequest) (*api.SnapshotResponse, error) {
	return nil, errgrpc.ToGRPC(fmt.Errorf("sandbox x is busy: %w", errdefs.ErrUnavailable))
}

func TestDial(t *testing.T) {
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	api.RegisterSnapshotsService(srv, listOnly{})
	sock := filepath.Join(t.TempDir(), "shim.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(context.Background(), ln)
	defer srv.Close()
	c, err := Dial(context.Background(), "unix://"+sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, err := c.List(context.Background(), &api.ListRequest{ContainerId: "c1"})
	if err != nil || r.SandboxId != "sb-of-c1" {
		t.Fatalf("list: %+v %v", r, err)
	}
	// Errors come back with their class and the shim's message only.
	if _, err := c.Snapshot(context.Background(), &api.SnapshotRequest{}); !errdefs.IsUnavailable(err) || err.Error() != "sandbox x is busy: unavailable" {
		t.Fatalf("snapshot error: %q", err)
	}
	if _, err := Dial(context.Background(), "unix://"+sock+".gone"); !errdefs.IsUnavailable(err) {
		t.Fatalf("dial a missing socket: %v", err)
	}
	if _, err := Dial(context.Background(), "vsock://3:1024"); !errdefs.IsNotImplemented(err) {
		t.Fatalf("vsock address: %v", err)
	}
}
