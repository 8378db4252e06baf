package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"

	"github.com/cube-runtime/cube/checkpoint/clone"
	"github.com/cube-runtime/cube/checkpoint/shimclient"
	"github.com/cube-runtime/cube/checkpoint/store/storetest"
	"github.com/cube-runtime/cube/hypervisor/control"
	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/sandbox/sandboxtest"
	"github.com/cube-runtime/cube/shim/snapshotsvc"
)

// fakeContainerd knows the containers of namespace ns.
type fakeContainerd struct {
	ns         string
	containers map[string]shimclient.Container
}

func (f *fakeContainerd) Container(ctx context.Context, id string) (shimclient.Container, error) {
	c, ok := f.containers[id]
	if !ok {
		return shimclient.Container{}, fmt.Errorf("no container %s in namespace %s: %w", id, f.ns, errdefs.ErrNotFound)
	}
	return c, nil
}

type oneVM struct{ sb *sandbox.Sandbox }

func (o oneVM) SandboxOf(id string) (*sandbox.Sandbox, error) {
	if id != "c1" {
		return nil, fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	return o.sb, nil
}

// world is containerd's state directory with the task c1 of namespace ns1
// (io.cube.v1) and its shim: the real snapshot service over ttrpc on a fake
// VM whose VMM writes synthetic VM snapshots; and an empty store.
type world struct {
	env         Env
	state, root string
	vmm         *sandboxtest.VMM
	agent       *sandboxtest.Agent
	maker       *fakeMaker

	mu   sync.Mutex
	last string
}

func newWorld(t *testing.T) *world { return newNetWorld(t, nil) }

// newNetWorld is newWorld whose sandbox has a network (nil: none).
func newNetWorld(t *testing.T, network sandbox.Network) *world {
	t.Helper()
	w := &world{state: t.TempDir(), root: filepath.Join(t.TempDir(), "store")}
	agent := sandboxtest.NewAgent()
	w.vmm, w.agent = sandboxtest.NewVMM(agent), agent
	w.vmm.SnapshotFunc = w.write
	sb, err := sandbox.New(sandbox.Options{ID: "c1", Dir: filepath.Join(t.TempDir(), "sb"), DiskSlots: 1,
		VMM: w.vmm, Dial: sandboxtest.Dialer(agent), BootTimeout: time.Second, Network: network})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Start(context.Background(), "/img/c1.ext4", "c1"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Stop(context.Background()) })
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	snapshotsvc.New(snapshotsvc.Options{Namespace: "ns1", Sandboxes: oneVM{sb}}).RegisterTTRPC(srv)
	sock := filepath.Join(t.TempDir(), "shim.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(context.Background(), ln)
	t.Cleanup(func() { srv.Close() })
	// containerd's record of the shim, as it writes it.
	bundle := shimclient.TaskDir(w.state, "ns1", "c1")
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "bootstrap.json"), []byte(`{"version":3,"address":"unix://`+sock+`","protocol":"ttrpc"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cd := &fakeContainerd{ns: "ns1", containers: map[string]shimclient.Container{
		"c1":   {ID: "c1", Namespace: "ns1", Runtime: shimclient.RuntimeName, Group: "c1", Task: "running"},
		"runc": {ID: "runc", Namespace: "ns1", Runtime: "io.containerd.runc.v2", Group: "runc", Task: "running"},
	}}
	w.env = ProcessEnv()
	w.env.Getenv = func(k string) string {
		return map[string]string{EnvNamespace: "ns1", EnvState: w.state, EnvStoreRoot: w.root}[k]
	}
	w.env.Containers = func(ctx context.Context, address, ns string) (shimclient.Containers, io.Closer, error) {
		return cd, io.NopCloser(nil), nil
	}
	w.maker = &fakeMaker{made: map[string]string{}}
	w.env.Maker = func(ctx context.Context, address, ns string) (clone.Maker, io.Closer, error) {
		return w.maker, io.NopCloser(nil), nil
	}
	return w
}

// fakeMaker is containerd's side of restore and fork: it records what it
// would make.
type fakeMaker struct {
	mu     sync.Mutex
	made   map[string]string // id -> snapshot dir
	labels map[string]map[string]string
}

func (m *fakeMaker) DropLabel(ctx context.Context, id, label string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.labels[id], label)
	return nil
}

func (m *fakeMaker) Labelled(ctx context.Context, label string) (map[string]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]string{}
	for id, l := range m.labels {
		if v := l[label]; v != "" {
			out[id] = v
		}
	}
	return out, nil
}

func (m *fakeMaker) Record(ctx context.Context, id string) (clone.Record, error) {
	if id != "c1" {
		return clone.Record{}, fmt.Errorf("no container %s: %w", id, errdefs.ErrNotFound)
	}
	return clone.Record{Version: clone.RecordVersion, Container: id, Namespace: "ns1", Image: "docker.io/x/y:1",
		Snapshotter: "cube", Runtime: shimclient.RuntimeName, Spec: json.RawMessage(`{"ociVersion":"1.2.0"}`)}, nil
}

func (m *fakeMaker) Make(ctx context.Context, id string, rec clone.Record, dir string, labels map[string]string) (uint32, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.made[id]; ok {
		return 0, fmt.Errorf("container %s: %w", id, errdefs.ErrAlreadyExists)
	}
	m.made[id] = dir
	if m.labels == nil {
		m.labels = map[string]map[string]string{}
	}
	m.labels[id] = maps.Clone(labels)
	return uint32(os.Getpid()), nil
}

func (m *fakeMaker) Remove(ctx context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.made, id)
	delete(m.labels, id)
	return nil
}

func (w *world) write(ctx context.Context, dir string, incremental bool) (control.SnapshotResult, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	parent := ""
	if incremental {
		parent = w.last
	}
	if err := storetest.Write(dir, parent); err != nil {
		return control.SnapshotResult{}, err
	}
	w.last = dir
	return control.SnapshotResult{Dir: dir, FrozenMS: 7.5, TotalMS: 20, MemoryBytes: 4096, DiskBytes: 8192, Reflinked: true}, nil
}

// cube runs the command and wants exit status code.
func (w *world) cube(t *testing.T, code int, args ...string) (string, string) {
	t.Helper()
	got, out, errOut := run(t, w.env, args...)
	if got != code {
		t.Fatalf("cube %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), got, code, out, errOut)
	}
	return out, errOut
}

func TestSnapshotLsInspectRm(t *testing.T) {
	w := newWorld(t)
	out, _ := w.cube(t, ExitOK, "snapshot", "c1", "--name", "s1")
	for _, want := range []string{"names:   s1", "sandbox: ns1/c1", "kind:    full", "parent:  -", "frozen:  7.5 ms", "disks:   8.0 KiB (reflinked)"} {
		if !strings.Contains(out, want) {
			t.Errorf("cube snapshot output lacks %q:\n%s", want, out)
		}
	}
	s2, _ := w.cube(t, ExitOK, "snapshot", "--incremental", "c1", "--name", "s2", "-q")
	s2 = strings.TrimSpace(s2)
	if len(s2) != 24 {
		t.Fatalf("--quiet printed %q, want an id", s2)
	}
	out, _ = w.cube(t, ExitOK, "snapshots", "ls")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[1], " s1 ") ||
		!strings.Contains(lines[2], s2) || !strings.Contains(lines[2], "incremental") {
		t.Fatalf("ls:\n%s", out)
	}
	if out, _ = w.cube(t, ExitOK, "snapshots", "ls", "--sandbox", "c1", "-q"); len(strings.Fields(out)) != 2 {
		t.Fatalf("ls --sandbox c1 -q:\n%s", out)
	}
	if out, _ = w.cube(t, ExitOK, "snapshots", "ls", "--sandbox", "other/c1", "-q"); out != "" {
		t.Fatalf("ls --sandbox other/c1:\n%s", out)
	}
	// inspect joins the store's record and the running shim's figures.
	out, _ = w.cube(t, ExitOK, "snapshots", "inspect", "s2")
	var d Description
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("inspect: %v\n%s", err, out)
	}
	if d.ID != s2 || d.Kind != "incremental" || d.Parent == "" || d.Sandbox != "ns1/c1" || d.VM == nil ||
		!d.VM.Base || !d.VM.Incremental || d.VM.FrozenMS != 7.5 || d.VM.Container != "c1" {
		t.Fatalf("inspect s2: %+v (vm %+v)", d, d.VM)
	}
	// s1 is s2's parent: refused, naming the child; s2 goes, then s1.
	_, errOut := w.cube(t, ExitFailure, "snapshots", "rm", "s1")
	if !strings.Contains(errOut, "is the parent of "+s2) {
		t.Fatalf("rm s1: %s", errOut)
	}
	if out, _ = w.cube(t, ExitOK, "snapshots", "rm", "s2", "s1"); len(strings.Fields(out)) != 2 {
		t.Fatalf("rm s2 s1 printed %q", out)
	}
	if out, _ = w.cube(t, ExitOK, "snapshots", "ls", "-q"); out != "" {
		t.Fatalf("ls after rm: %q", out)
	}
}

func TestSnapshotErrorsNameTheFix(t *testing.T) {
	w := newWorld(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"snapshot", "nope"}, "no container nope in namespace ns1"},
		{[]string{"snapshot", "runc"}, "runs with runtime io.containerd.runc.v2: only io.cube.v1 containers"},
		{[]string{"snapshot", "c1", "--incremental"}, "take a full snapshot first"},
		{[]string{"snapshot", "c1", "--name", "-bad"}, `name "-bad"`},
		{[]string{"snapshot", "c1", "--state", "/nonexistent"}, "pass --state"},
		{[]string{"snapshots", "inspect", "nope"}, "'cube snapshots ls' lists the snapshots"},
	} {
		_, errOut := w.cube(t, ExitFailure, c.args...)
		if !strings.Contains(errOut, c.want) {
			t.Errorf("cube %v: stderr %q lacks %q", c.args, errOut, c.want)
		}
	}
	w.vmm.SnapshotErr = fmt.Errorf("no space left on device")
	if _, errOut := w.cube(t, ExitFailure, "snapshot", "c1", "--name", "s1"); !strings.Contains(errOut, "no space left on device") {
		t.Fatalf("vmm failure: %s", errOut)
	}
	// Nothing of the failed attempts stays; the name is free again.
	w.vmm.SnapshotErr = nil
	w.cube(t, ExitOK, "snapshot", "c1", "--name", "s1", "-q")
	if out, _ := w.cube(t, ExitOK, "snapshots", "ls", "-q"); len(strings.Fields(out)) != 1 {
		t.Fatalf("store after failures:\n%s", out)
	}
}

func TestSnapshotBusy(t *testing.T) {
	w := newWorld(t)
	entered, release := make(chan struct{}), make(chan struct{})
	w.vmm.SnapshotFunc = func(ctx context.Context, dir string, inc bool) (control.SnapshotResult, error) {
		close(entered)
		<-release
		return w.write(ctx, dir, inc)
	}
	done := make(chan int, 1)
	go func() {
		code, _, _ := run(t, w.env, "snapshot", "c1", "--name", "first")
		done <- code
	}()
	<-entered
	_, errOut := w.cube(t, ExitFailure, "snapshot", "c1", "--name", "second")
	t.Logf("busy: %s", errOut)
	if !strings.Contains(errOut, `sandbox c1 is busy: snapshot "first" (of container c1)`) {
		t.Fatalf("second snapshot: %s", errOut)
	}
	close(release)
	if code := <-done; code != ExitOK {
		t.Fatalf("first snapshot: exit %d", code)
	}
}

// TestRestoreAndFork: `cube snapshot` records the container in the
// snapshot, `cube restore` makes a container from it (holding the snapshot),
// `cube fork` makes N and leaves no snapshot behind; usage errors.
func TestRestoreAndFork(t *testing.T) {
	w := newWorld(t)
	id := strings.TrimSpace(func() string { out, _ := w.cube(t, ExitOK, "snapshot", "c1", "--name", "s1", "-q"); return out }())
	desc := func() Description {
		out, _ := w.cube(t, ExitOK, "snapshots", "inspect", "s1")
		var d Description
		if err := json.Unmarshal([]byte(out), &d); err != nil {
			t.Fatal(err)
		}
		return d
	}()
	if _, err := clone.ReadRecord(desc.Dir); err != nil {
		t.Fatalf("the snapshot's container record: %v", err)
	}
	out, _ := w.cube(t, ExitOK, "restore", "s1", "r1", "--json")
	var r restoredJSON
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.ID != "r1" || r.Snapshot != id || w.maker.made["r1"] != desc.Dir {
		t.Fatalf("restore: %s %v (made %v)", out, err, w.maker.made)
	}
	if _, errOut := w.cube(t, ExitFailure, "snapshots", "rm", "s1"); !strings.Contains(errOut, "sandbox ns1/r1") {
		t.Errorf("rm of a snapshot a restored VM maps: %s", errOut)
	}
	if _, errOut := w.cube(t, ExitFailure, "restore", "nosuch", "r2"); !strings.Contains(errOut, `no snapshot "nosuch"`) {
		t.Errorf("restore of a missing snapshot: %s", errOut)
	}

	// A clone a crashed fork left (its fork's process is gone) is removed first.
	w.maker.Make(context.Background(), "crashed-1", clone.Record{}, "/x", map[string]string{clone.LabelForkPending: "fork-x/2147483646/1"})
	out, errOut := w.cube(t, ExitOK, "fork", "c1", "-n", "2", "--prefix", "k")
	if _, left := w.maker.made["crashed-1"]; left || !strings.Contains(errOut, "removed crashed-1, a clone left by a fork that did not finish") {
		t.Errorf("a crashed fork's clone: left %v, stderr %q", left, errOut)
	}
	if w.maker.labels["k-1"][clone.LabelForkPending] != "" {
		t.Errorf("a kept clone is still marked pending: %v", w.maker.labels["k-1"])
	}
	for _, want := range []string{"k-1 vmm pid", "k-2 vmm pid", "temporary"} {
		if !strings.Contains(out, want) {
			t.Errorf("fork output lacks %q:\n%s", want, out)
		}
	}
	if w.maker.made["k-1"] == "" || w.maker.made["k-2"] == "" {
		t.Errorf("fork made %v", w.maker.made)
	}
	if out, _ := w.cube(t, ExitOK, "snapshots", "ls", "-q"); strings.TrimSpace(out) != id {
		t.Errorf("store after the fork: %q, want only %s", out, id)
	}
	// k-1 exists: all or nothing fails on it and removes nothing else.
	_, errOut = w.cube(t, ExitFailure, "fork", "c1", "-n", "2", "--prefix", "k", "--all-or-nothing")
	if !strings.Contains(errOut, "all or nothing") {
		t.Errorf("all-or-nothing fork onto a taken id: %s", errOut)
	}
	for _, bad := range [][]string{{"fork", "c1"}, {"fork", "c1", "-n", "101"}, {"fork", "-n", "1"}, {"restore", "s1"}} {
		if _, errOut := w.cube(t, ExitUsage, bad...); errOut == "" {
			t.Errorf("cube %v: no usage error", bad)
		}
	}
	// A prefix that makes invalid ids ("bench-" → "bench--1") is refused
	// naming the flag, before any snapshot is taken.
	_, errOut = w.cube(t, ExitUsage, "fork", "c1", "-n", "1", "--prefix", "bench-")
	if !strings.Contains(errOut, "--prefix") {
		t.Errorf("fork --prefix bench-: %s, want the flag named", errOut)
	}
	if out, _ := w.cube(t, ExitOK, "snapshots", "ls", "-q"); strings.TrimSpace(out) != id {
		t.Errorf("store after a refused fork: %q, want only %s", out, id)
	}
}
