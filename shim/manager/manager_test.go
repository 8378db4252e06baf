package manager_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	bootapi "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/fifo"
	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cube-runtime/cube/shim/manager"
	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/sandbox/vmmtest"
	"github.com/cube-runtime/cube/shim/snapshotapi"
	_ "github.com/cube-runtime/cube/shim/snapshotsvc/plugin"
	_ "github.com/cube-runtime/cube/shim/task/plugin"
)

// The test binary doubles as the shim binary (CUBE_SHIM_SELF=1) and, when
// the shim execs it with cube-vmm's flags, as cube-vmm.
func TestMain(m *testing.M) {
	if os.Getenv("CUBE_SHIM_SELF") == "1" {
		if vmmtest.IsFakeVMMArgs(os.Args[1:]) {
			os.Exit(vmmtest.FakeVMMMain(os.Args[1:]))
		}
		shim.RunShim(context.Background(), manager.New(manager.RuntimeName))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestGroupID(t *testing.T) {
	if g := manager.GroupID("c1", nil); g != "c1" {
		t.Fatal(g)
	}
	if g := manager.GroupID("app", map[string]string{"io.kubernetes.cri.sandbox-id": "pod"}); g != "pod" {
		t.Fatal(g)
	}
}

type env struct {
	t              testing.TB
	self, sockDir  string
	containerdAddr string
}

func writeBundle(t testing.TB, parent, id string, ann map[string]string) string {
	t.Helper()
	dir := filepath.Join(parent, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(specs.Spec{Version: specs.Version, Process: &specs.Process{Args: []string{"sh"}, Cwd: "/"}, Annotations: ann})
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// runAction runs the shim binary like containerd does for start and delete.
func (e *env) runAction(bundle, id, action string, stdin []byte) []byte {
	e.t.Helper()
	cmd := exec.Command(e.self, "-namespace", "test", "-id", id, "-address", e.containerdAddr, action)
	cmd.Dir = bundle
	cmd.Env = append(os.Environ(), "CUBE_SHIM_SELF=1", "TTRPC_ADDRESS="+e.containerdAddr+".ttrpc")
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		e.t.Fatalf("shim %s: %v\n%s", action, err, stderr.String())
	}
	return out
}

func (e *env) start(bundle, id string) *bootapi.BootstrapResult {
	e.t.Helper()
	// The shim server writes its log into the bundle's "log" fifo; containerd
	// holds the read end, so does the test.
	lf, err := fifo.OpenFifo(context.Background(), filepath.Join(bundle, "log"), syscall.O_RDONLY|syscall.O_CREAT|syscall.O_NONBLOCK, 0o700)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { lf.Close() })
	go func() { _, _ = bytes.NewBuffer(nil).ReadFrom(lf) }()
	params, _ := proto.Marshal(&bootapi.BootstrapParams{
		InstanceID: id, Namespace: "test", ContainerdGrpcAddress: e.containerdAddr,
		ContainerdTtrpcAddress: e.containerdAddr + ".ttrpc", SocketDir: &e.sockDir,
	})
	var res bootapi.BootstrapResult
	if err := proto.Unmarshal(e.runAction(bundle, id, "start", params), &res); err != nil {
		e.t.Fatal(err)
	}
	return &res
}

// TestShimBinary drives the real shim binary the way containerd does: the
// start action with bootstrap params on stdin, task API v3 over ttrpc on the
// returned socket, pod grouping, Shutdown, and the delete action cleaning up
// a VMM that a crashed shim left behind.
func TestShimBinary(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The shim server is a daemon (its parent, the start action, exits at
	// once); become its subreaper so it is reaped here, not left a zombie.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	defer reapOrphans()
	// Unix socket paths are limited to 108 bytes: keep the dir short.
	sockDir, err := os.MkdirTemp("/tmp", "cs")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	e := &env{t: t, self: self, sockDir: sockDir, containerdAddr: filepath.Join(sockDir, "containerd.sock")}
	// A failing test must not leave its shim server behind: kill, by pid,
	// whatever still runs with this test's containerd address.
	defer killServers(e.containerdAddr)
	parent := t.TempDir()
	pod := map[string]string{"io.kubernetes.cri.sandbox-id": "pod1"}
	bundle := writeBundle(t, parent, "pod1", pod)

	res := e.start(bundle, "pod1")
	if res.Version != 3 || res.Protocol != "ttrpc" || !strings.HasPrefix(res.Address, "unix://"+sockDir) {
		t.Fatalf("bootstrap result %+v", res)
	}
	if len(res.Extensions) != 1 {
		t.Fatalf("extensions %v", res.Extensions)
	}
	v, err := typeurl.UnmarshalAny(res.Extensions[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	if caps, ok := v.(*types.MountCapabilities); !ok || strings.Join(caps.Types, ",") != "ext4" {
		t.Fatalf("mount capabilities %#v", v)
	}
	// A pod member gets the same shim.
	member := writeBundle(t, parent, "app1", pod)
	if res2 := e.start(member, "app1"); res2.Address != res.Address {
		t.Fatalf("pod member got %s, want %s", res2.Address, res.Address)
	}

	conn, err := shimDial(res.Address)
	if err != nil {
		t.Fatal(err)
	}
	client := ttrpc.NewClient(conn)
	defer client.Close()
	tc := taskAPI.NewTTRPCTaskClient(client)
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), "test"), 20*time.Second)
	defer cancel()

	if _, err := tc.State(ctx, &taskAPI.StateRequest{ID: "pod1"}); status.Code(err) != codes.NotFound {
		t.Fatalf("state before create: %v", err)
	}
	// The shim's own snapshot service answers on the same socket (a TTRPC
	// plugin on pkg/shim's one server), and knows no container yet.
	sc := snapshotapi.NewSnapshotsClient(client)
	if _, err := sc.List(ctx, &snapshotapi.ListRequest{ContainerId: "pod1"}); status.Code(err) != codes.NotFound ||
		!strings.Contains(err.Error(), "not found in this shim") {
		t.Fatalf("snapshot service list before create: %v", err)
	}
	_, err = tc.Create(ctx, &taskAPI.CreateTaskRequest{ID: "pod1", Bundle: bundle,
		Rootfs: []*types.Mount{{Type: "overlay", Source: "overlay", Options: []string{"lowerdir=/x"}}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "--snapshotter cube") {
		t.Fatalf("overlay rootfs: %v", err)
	}

	// A real VMM process (the stand-in cube-vmm) starts; with no guest agent
	// behind it the create fails, and the VM is cleaned up.
	stateDir := filepath.Join(sockDir, "state")
	opts, _ := typeurl.MarshalAnyToProto(&runtimeoptions.Options{ConfigBody: []byte(
		"vmm = \"" + self + "\"\nstate_dir = \"" + stateDir + "\"\nboot_timeout = \"1s\"\n")})
	_, err = tc.Create(ctx, &taskAPI.CreateTaskRequest{ID: "pod1", Bundle: bundle, Options: opts,
		Rootfs: []*types.Mount{{Type: "ext4", Source: "/images/pod1.ext4", Options: []string{"loop", "rw"}}}})
	if err == nil || !strings.Contains(err.Error(), "agent did not answer before the boot timeout") {
		t.Fatalf("create with no guest agent: %v", err)
	}
	if ents, _ := os.ReadDir(stateDir); len(ents) != 0 {
		t.Fatalf("sandbox state left behind: %v", ents)
	}

	// The shim may exit before its reply is out; containerd ignores that too.
	if _, err := tc.Shutdown(ctx, &taskAPI.ShutdownRequest{ID: "pod1"}); err != nil && !errors.Is(err, ttrpc.ErrClosed) {
		t.Fatal(err)
	}
	// The server is gone: its socket no longer accepts connections.
	deadline := time.Now().Add(10 * time.Second)
	for shim.CanConnect(res.Address) {
		if time.Now().After(deadline) {
			t.Fatal("shim still serving after Shutdown")
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The delete action after a crash: a VMM recorded in the bundle is killed
	// and its state dir removed.
	vmmDir, err := os.MkdirTemp(sockDir, "vm")
	if err != nil {
		t.Fatal(err)
	}
	vmm := exec.Command(self, "-kernel", "k", "-memory", "64", "-vsock", filepath.Join(vmmDir, "v.sock"),
		"-control", filepath.Join(vmmDir, "c.sock"), "-console", filepath.Join(vmmDir, "console"))
	vmm.Env = append(os.Environ(), "CUBE_SHIM_SELF=1")
	if err := vmm.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- vmm.Wait() }()
	if err := sandbox.WriteRecord(bundle, sandbox.Record{SandboxID: "pod1", Dir: vmmDir, VMMPid: vmm.Process.Pid}); err != nil {
		t.Fatal(err)
	}
	var del taskAPI.DeleteResponse
	if err := proto.Unmarshal(e.runAction(bundle, "pod1", "delete", nil), &del); err != nil {
		t.Fatal(err)
	}
	if del.ExitStatus != 137 || del.Pid != uint32(vmm.Process.Pid) {
		t.Fatalf("delete response %+v", &del)
	}
	select {
	case <-exited:
	case <-ctx.Done():
		vmm.Process.Kill()
		t.Fatal("delete action did not kill the recorded VMM")
	}
	if _, err := os.Stat(vmmDir); !os.IsNotExist(err) {
		t.Fatalf("vmm dir left: %v", err)
	}
}

// reapOrphans waits for daemonized children that exited (non-blocking).
func reapOrphans() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

// BenchmarkShimStartShutdown: containerd's `start` action (which spawns the
// long-running shim server) until the task API answers, then Shutdown until
// the server is gone — the shim's share of a `ctr run` apart from the VM.
func BenchmarkShimStartShutdown(b *testing.B) {
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		b.Fatal(err)
	}
	defer reapOrphans()
	sockDir, err := os.MkdirTemp("/tmp", "cs")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	e := &env{t: b, self: self, sockDir: sockDir, containerdAddr: filepath.Join(sockDir, "containerd.sock")}
	parent := b.TempDir()
	ctx := namespaces.WithNamespace(context.Background(), "test")
	i := 0
	for b.Loop() {
		i++
		id := fmt.Sprintf("c%d", i)
		bundle := writeBundle(b, parent, id, nil)
		res := e.start(bundle, id)
		conn, err := shimDial(res.Address)
		if err != nil {
			b.Fatal(err)
		}
		client := ttrpc.NewClient(conn)
		tc := taskAPI.NewTTRPCTaskClient(client)
		if _, err := tc.Connect(ctx, &taskAPI.ConnectRequest{ID: id}); status.Code(err) != codes.NotFound {
			b.Fatalf("connect: %v", err)
		}
		if _, err := tc.Shutdown(ctx, &taskAPI.ShutdownRequest{ID: id}); err != nil && !errors.Is(err, ttrpc.ErrClosed) {
			b.Fatal(err)
		}
		client.Close()
		for shim.CanConnect(res.Address) {
			time.Sleep(time.Millisecond)
		}
		reapOrphans()
	}
}

// killServers SIGKILLs the shim servers started with -address addr.
func killServers(addr string) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte("\x00"+addr+"\x00")) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	reapOrphans()
}
