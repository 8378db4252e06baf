package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"github.com/cube-runtime/cube/guest-agent/container"
	"github.com/cube-runtime/cube/guest-agent/initsys"
	"github.com/cube-runtime/cube/guest-agent/protocol"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) {
	// The service re-executes this test binary as the container helper.
	container.MaybeRunInit()
	os.Exit(m.Run())
}

// One reaper per process: two would steal each other's children.
var (
	reaperOnce sync.Once
	reaper     *initsys.Reaper
	reaperErr  error
)

func testReaper(t testing.TB) *initsys.Reaper {
	reaperOnce.Do(func() {
		reaper, reaperErr = initsys.NewReaper(logrus.New())
		if reaperErr == nil {
			go reaper.Run(context.Background())
		}
	})
	if reaperErr != nil {
		t.Fatal(reaperErr)
	}
	return reaper
}

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: containers need namespaces, mounts and pivot_root")
	}
}

// testCgroupRoot mounts a cgroup2 hierarchy (the host may be on cgroup v1)
// and returns a fresh directory in it for the service's container cgroups;
// "-" (cgroups off) without root.
func testCgroupRoot(t testing.TB) string {
	if os.Geteuid() != 0 {
		return "-"
	}
	mnt := t.TempDir()
	if err := unix.Mount("cgroup2", mnt, "cgroup2", 0, ""); err != nil {
		t.Logf("cannot mount cgroup2 (%v): container cgroups off", err)
		return "-"
	}
	root := filepath.Join(mnt, fmt.Sprintf("cube-agent-test-%d-%d", os.Getpid(), time.Now().UnixNano()))
	t.Cleanup(func() {
		unix.Rmdir(root)
		unix.Unmount(mnt, unix.MNT_DETACH)
	})
	return root
}

type harness struct {
	t          testing.TB
	svc        *Service
	client     protocol.AgentService
	agentSock  string
	streamSock string
	conn       net.Conn
	cancel     context.CancelFunc
}

func newHarness(t testing.TB, mod func(*Config)) *harness {
	t.Helper()
	dir := t.TempDir()
	log := logrus.New()
	log.SetOutput(io.Discard)
	if testing.Verbose() {
		log.SetOutput(os.Stderr)
	}
	cfg := Config{Reaper: testReaper(t), Log: log, DiskRoot: filepath.Join(dir, "disks"), CgroupRoot: testCgroupRoot(t)}
	if mod != nil {
		mod(&cfg)
	}
	svc, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, svc: svc, agentSock: filepath.Join(dir, "agent.sock"), streamSock: filepath.Join(dir, "stream.sock")}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	unixListen := func(p string) Listen {
		return func() (net.Listener, error) {
			os.Remove(p)
			return net.Listen("unix", p)
		}
	}
	done := make(chan struct{})
	go func() {
		svc.Serve(ctx, unixListen(h.agentSock), unixListen(h.streamSock))
		close(done)
	}()
	h.dial()
	t.Cleanup(func() {
		h.conn.Close()
		cancel()
		<-done
	})
	return h
}

func (h *harness) dial() {
	h.t.Helper()
	var conn net.Conn
	var err error
	for i := 0; i < 200; i++ {
		if conn, err = net.Dial("unix", h.agentSock); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		h.t.Fatal(err)
	}
	h.conn = conn
	h.client = protocol.NewAgentClient(ttrpc.NewClient(conn))
}

func (h *harness) stream(id, exec string, s protocol.Stream) net.Conn {
	h.t.Helper()
	c, err := net.Dial("unix", h.streamSock)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := protocol.OpenStream(c, protocol.StreamHeader{ContainerID: id, ExecID: exec, Stream: s}); err != nil {
		c.Close()
		h.t.Fatalf("open %s stream of %s/%s: %v", s, id, exec, err)
	}
	h.t.Cleanup(func() { c.Close() })
	return c
}

// makeRootfs builds a busybox rootfs (busybox-static at /bin/busybox).
func makeRootfs(t testing.TB) string {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skipf("needs busybox-static at /bin/busybox for a container rootfs: %v", err)
	}
	root := t.TempDir()
	for _, d := range []string{"bin", "proc", "dev", "tmp", "etc", "root"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), bb, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"sh", "echo", "cat", "sleep", "true", "false", "hostname", "stty", "tty", "id", "pwd", "ls", "env", "ulimit", "read", "kill", "head"} {
		os.Symlink("busybox", filepath.Join(root, "bin", a))
	}
	if err := os.WriteFile(filepath.Join(root, "bin/notexec"), []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

func testSpec(root string, args ...string) *specs.Spec {
	return &specs.Spec{
		Version:  specs.Version,
		Process:  &specs.Process{Args: args, Cwd: "/", Env: []string{"PATH=/bin", "HOME=/root"}},
		Root:     &specs.Root{Path: root},
		Hostname: "cube-test",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs"},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.MountNamespace}, {Type: specs.PIDNamespace}, {Type: specs.UTSNamespace}, {Type: specs.IPCNamespace},
			},
			MaskedPaths:   []string{"/proc/kcore"},
			ReadonlyPaths: []string{"/proc/sys"},
		},
	}
}

func specJSON(t testing.TB, s any) []byte {
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// create creates container id (force-deleted at the end of the test) and
// returns what the create took in the guest (CreateContainerResponse.timing).
func (h *harness) create(id string, spec *specs.Spec, stdio *protocol.Stdio) string {
	h.t.Helper()
	r, err := h.client.CreateContainer(context.Background(), &protocol.CreateContainerRequest{ContainerId: id, Spec: specJSON(h.t, spec), Stdio: stdio})
	if err != nil {
		h.t.Fatalf("create %s: %v", id, err)
	}
	h.t.Cleanup(func() {
		h.client.Delete(context.Background(), &protocol.DeleteRequest{ContainerId: id, Force: true})
	})
	return r.Timing
}

func (h *harness) start(id, exec string) {
	h.t.Helper()
	if _, err := h.client.Start(context.Background(), &protocol.StartRequest{ContainerId: id, ExecId: exec}); err != nil {
		h.t.Fatalf("start %s/%s: %v", id, exec, err)
	}
}

func (h *harness) wait(id, exec string) *protocol.WaitResponse {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := h.client.Wait(ctx, &protocol.WaitRequest{ContainerId: id, ExecId: exec})
	if err != nil {
		h.t.Fatalf("wait %s/%s: %v", id, exec, err)
	}
	return r
}

func readAll(t *testing.T, c net.Conn) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(time.Minute))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read stream: %v", err)
	}
	return string(b)
}

func wantCode(t *testing.T, err error, code codes.Code, contains string) {
	t.Helper()
	st, ok := status.FromError(err)
	if err == nil || !ok || st.Code() != code || !strings.Contains(st.Message(), contains) {
		t.Errorf("got error %v, want %v containing %q", err, code, contains)
	}
}

func TestRunOutputAndExitCode(t *testing.T) {
	needRoot(t)
	h := newHarness(t, nil)
	root := makeRootfs(t)
	h.create("c1", testSpec(root, "sh", "-c", "echo hello; echo oops >&2; hostname; echo pid=$$; pwd; exit 3"), &protocol.Stdio{Stdout: true, Stderr: true})
	out := h.stream("c1", "", protocol.Stdout)
	errc := h.stream("c1", "", protocol.Stderr)
	st, err := h.client.State(context.Background(), &protocol.StateRequest{ContainerId: "c1"})
	if err != nil || st.Status != "created" {
		t.Fatalf("state before start: %v %v", st, err)
	}
	h.start("c1", "")
	if got, want := readAll(t, out), "hello\ncube-test\npid=1\n/\n"; got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
	if got := readAll(t, errc); got != "oops\n" {
		t.Errorf("stderr %q", got)
	}
	if w := h.wait("c1", ""); w.ExitStatus != 3 || w.Signal != 0 || w.ExitedAtUnixNano == 0 {
		t.Errorf("wait = %+v, want exit 3", w)
	}
	d, err := h.client.Delete(context.Background(), &protocol.DeleteRequest{ContainerId: "c1"})
	if err != nil || d.ExitStatus != 3 {
		t.Fatalf("delete = %v, %v", d, err)
	}
	_, err = h.client.State(context.Background(), &protocol.StateRequest{ContainerId: "c1"})
	wantCode(t, err, codes.NotFound, `container "c1" not found`)
}

func TestStdinAndUser(t *testing.T) {
	needRoot(t)
	h := newHarness(t, nil)
	root := makeRootfs(t)
	spec := testSpec(root, "sh", "-c", "cat; id -u; id -G; ulimit -n")
	spec.Process.User = specs.User{UID: 1000, GID: 1000, AdditionalGids: []uint32{10, 20}}
	spec.Process.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 123, Hard: 456}}
	h.create("c2", spec, &protocol.Stdio{Stdin: true, Stdout: true})
	in := h.stream("c2", "", protocol.Stdin)
	out := h.stream("c2", "", protocol.Stdout)
	h.start("c2", "")
	io.WriteString(in, "from stdin\n")
	in.(*net.UnixConn).CloseWrite()
	if got, want := readAll(t, out), "from stdin\n1000\n1000 10 20\n123\n"; got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
	if w := h.wait("c2", ""); w.ExitStatus != 0 {
		t.Errorf("exit %d", w.ExitStatus)
	}
}

func TestCloseStdinRPC(t *testing.T) {
	needRoot(t)
	h := newHarness(t, nil)
	h.create("c3", testSpec(makeRootfs(t), "cat"), &protocol.Stdio{Stdin: true, Stdout: true})
	in := h.stream("c3", "", protocol.Stdin)
	out := h.stream("c3", "", protocol.Stdout)
	h.start("c3", "")
	io.WriteString(in, "x")
	// Let the byte reach the pipe before closing it from the other side.
	buf := make([]byte, 1)
	out.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := io.ReadFull(out, buf); err != nil || buf[0] != 'x' {
		t.Fatalf("echo: %q %v", buf, err)
	}
	if _, err := h.client.CloseStdin(context.Background(), &protocol.CloseStdinRequest{ContainerId: "c3"}); err != nil {
		t.Fatal(err)
	}
	if w := h.wait("c3", ""); w.ExitStatus != 0 {
		t.Errorf("cat after stdin close: exit %d", w.ExitStatus)
	}
}

// TestCloseStdinWaitsForStreamData: the host half-closes its stdin stream and then calls CloseStdin on
// another connection; the RPC may arrive before the stream's last bytes, which must still reach the process.
func TestCloseStdinWaitsForStreamData(t *testing.T) {
	needRoot(t)
	h := newHarness(t, nil)
	h.create("c4", testSpec(makeRootfs(t), "cat"), &protocol.Stdio{Stdin: true, Stdout: true})
	in := h.stream("c4", "", protocol.Stdin)
	out := h.stream("c4", "", protocol.Stdout)
	h.start("c4", "")
	closed := make(chan error, 1)
	go func() {
		_, err := h.client.CloseStdin(context.Background(), &protocol.CloseStdinRequest{ContainerId: "c4"})
		closed <- err
	}()
	// The RPC is in the agent (or about to be) before the data is written: the worst order.
	time.Sleep(200 * time.Millisecond)
	io.WriteString(in, "late data\n")
	in.(*net.UnixConn).CloseWrite()
	if err := <-closed; err != nil {
		t.Fatalf("CloseStdin: %v", err)
	}
	if got := readAll(t, out); got != "late data\n" {
		t.Errorf("stdout %q, want the bytes sent before the half-close", got)
	}
	if w := h.wait("c4", ""); w.ExitStatus != 0 {
		t.Errorf("exit %d", w.ExitStatus)
	}
}

func TestSignals(t *testing.T) {
	needRoot(t)
	h := newHarness(t, nil)
	root := makeRootfs(t)
	// A pid namespace's init only gets signals it handles (SIGKILL aside).
	h.create("trap", testSpec(root, "sh", "-c", "trap 'exit 42' TERM; echo ready; while :; do sleep 0.05; done"), &protocol.Stdio{Stdout: true})
	out := h.stream("trap", "", protocol.Stdout)
	h.start("trap", "")
	line := make([]byte, 6)
	out.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := io.ReadFull(out, line); err != nil || string(line) != "ready\n" {
		t.Fatalf("ready line: %q %v", line, err)
	}
	if _, err := h.client.Signal(context.Background(), &protocol.SignalRequest{ContainerId: "trap", Signal: 15}); err != nil {
		t.Fatal(err)
	}
	if w := h.wait("trap", ""); w.ExitStatus != 42 {
		t.Errorf("TERM with trap: exit %d, want 42", w.ExitStatus)
	}

	h.create("kill", testSpec(root, "sleep", "1000"), nil)
	h.start("kill", "")
	if _, err := h.client.Signal(context.Background(), &protocol.SignalRequest{ContainerId: "kill", Signal: 9}); err != nil {
		t.Fatal(err)
	}
	if w := h.wait("kill", ""); w.ExitStatus != 137 || w.Signal != 9 {
		t.Errorf("SIGKILL: %+v, want 137/9", w)
	}
	_, err := h.client.Signal(context.Background(), &protocol.SignalRequest{ContainerId: "kill", Signal: 9})
	wantCode(t, err, codes.NotFound, "already exited")
}

func TestExecIntoRunningContainer(t *testing.T) {
	needRoot(t)
	h := newHarness(t, nil)
	root := makeRootfs(t)
	h.create("c4", testSpec(root, "sleep", "1000"), nil)
	h.start("c4", "")
	proc := &specs.Process{Args: []string{"sh", "-c", "hostname; cat /proc/1/cmdline | tr '\\0' ' '; echo; echo $$; exit 5"}, Cwd: "/tmp", Env: []string{"PATH=/bin"}}
	os.Symlink("busybox", filepath.Join(root, "bin", "tr"))
	r, err := h.client.ExecProcess(context.Background(), &protocol.ExecProcessRequest{ContainerId: "c4", ExecId: "e1", Process: specJSON(t, proc), Stdio: &protocol.Stdio{Stdout: true}})
	if err != nil {
		t.Fatal(err)
	}
	out := h.stream("c4", "e1", protocol.Stdout)
	pids, err := h.client.ListPids(context.Background(), &protocol.ListPidsRequest{ContainerId: "c4"})
	if err != nil || len(pids.Pids) < 2 {
		t.Errorf("list pids with a created exec: %v %v", pids, err)
	}
	found := false
	for _, p := range pids.GetPids() {
		found = found || p == r.Pid
	}
	if !found {
		t.Errorf("exec pid %d not in %v", r.Pid, pids.GetPids())
	}
	h.start("c4", "e1")
	got := readAll(t, out)
	lines := strings.Split(strings.TrimSpace(got), "\n")
	// Same hostname (uts), sees the container's init as pid 1 (mnt + pid).
	if len(lines) != 3 || lines[0] != "cube-test" || strings.TrimSpace(lines[1]) != "sleep 1000" || lines[2] == "1" || lines[2] == fmt.Sprint(r.Pid) {
		t.Errorf("exec output %q", got)
	}
	if w := h.wait("c4", "e1"); w.ExitStatus != 5 {
		t.Errorf("exec exit %d, want 5", w.ExitStatus)
	}
	_, err = h.client.Delete(context.Background(), &protocol.DeleteRequest{ContainerId: "c4"})
	wantCode(t, err, codes.FailedPrecondition, "is running")
	if _, err := h.client.Delete(context.Background(), &protocol.DeleteRequest{ContainerId: "c4", ExecId: "e1"}); err != nil {
		t.Errorf("delete exec: %v", err)
	}
	d, err := h.client.Delete(context.Background(), &protocol.DeleteRequest{ContainerId: "c4", Force: true})
	if err != nil || d.ExitStatus != 137 {
		t.Errorf("force delete: %v %v", d, err)
	}
}

func TestTerminal(t *testing.T) {
	needRoot(t)
	h := newHarness(t, nil)
	spec := testSpec(makeRootfs(t), "sh", "-c", "tty; stty size; read x; stty size; exit 7")
	spec.Process.Terminal = true
	spec.Process.ConsoleSize = &specs.Box{Width: 100, Height: 30}
	_, err := h.client.CreateContainer(context.Background(), &protocol.CreateContainerRequest{ContainerId: "tty", Spec: specJSON(t, spec), Stdio: &protocol.Stdio{Stdin: true, Stdout: true, Stderr: true}})
	wantCode(t, err, codes.InvalidArgument, "stderr is not available with a terminal")
	h.create("tty", spec, &protocol.Stdio{Stdin: true, Stdout: true})
	in := h.stream("tty", "", protocol.Stdin)
	out := h.stream("tty", "", protocol.Stdout)
	h.start("tty", "")
	var got bytes.Buffer
	readUntil := func(s string) {
		t.Helper()
		buf := make([]byte, 256)
		out.SetReadDeadline(time.Now().Add(time.Minute))
		for !strings.Contains(got.String(), s) {
			n, err := out.Read(buf)
			got.Write(buf[:n])
			if err != nil {
				t.Fatalf("waiting for %q in terminal output %q: %v", s, got.String(), err)
			}
		}
	}
	// The terminal is in the container's own devpts instance, so it has a name there (as with runc).
	readUntil("/dev/pts/0")
	readUntil("30 100")

	// An exec with a terminal gets a pty of the same container devpts instance.
	proc := &specs.Process{Args: []string{"sh", "-c", "tty; stty size"}, Cwd: "/", Env: []string{"PATH=/bin"}, Terminal: true,
		ConsoleSize: &specs.Box{Width: 90, Height: 20}}
	if _, err := h.client.ExecProcess(context.Background(), &protocol.ExecProcessRequest{ContainerId: "tty", ExecId: "e", Process: specJSON(t, proc), Stdio: &protocol.Stdio{Stdout: true}}); err != nil {
		t.Fatal(err)
	}
	eout := h.stream("tty", "e", protocol.Stdout)
	h.start("tty", "e")
	if got := readAll(t, eout); !strings.Contains(got, "/dev/pts/1") || !strings.Contains(got, "20 90") {
		t.Errorf("exec terminal output %q, want /dev/pts/1 and 20 90", got)
	}
	if w := h.wait("tty", "e"); w.ExitStatus != 0 {
		t.Errorf("exec exit %d", w.ExitStatus)
	}

	if _, err := h.client.ResizePty(context.Background(), &protocol.ResizePtyRequest{ContainerId: "tty", Width: 120, Height: 40}); err != nil {
		t.Fatal(err)
	}
	io.WriteString(in, "go\r")
	readUntil("40 120")
	if w := h.wait("tty", ""); w.ExitStatus != 7 {
		t.Errorf("exit %d", w.ExitStatus)
	}
}

func TestErrorsArePrecise(t *testing.T) {
	h := newHarness(t, nil)
	// Validation happens before anything is spawned: no root needed here.
	root := t.TempDir()
	ctx := context.Background()
	create := func(id string, spec *specs.Spec) error {
		_, err := h.client.CreateContainer(ctx, &protocol.CreateContainerRequest{ContainerId: id, Spec: specJSON(t, spec)})
		if err == nil {
			h.client.Delete(ctx, &protocol.DeleteRequest{ContainerId: id, Force: true})
		}
		return err
	}

	_, err := h.client.Start(ctx, &protocol.StartRequest{ContainerId: "nope"})
	wantCode(t, err, codes.NotFound, `container "nope" not found`)
	_, err = h.client.Wait(ctx, &protocol.WaitRequest{ContainerId: "nope"})
	wantCode(t, err, codes.NotFound, `container "nope" not found`)
	_, err = h.client.ExecProcess(ctx, &protocol.ExecProcessRequest{ContainerId: "nope", ExecId: "e", Process: []byte(`{"args":["true"],"cwd":"/"}`)})
	wantCode(t, err, codes.NotFound, `container "nope" not found`)
	_, err = h.client.Signal(ctx, &protocol.SignalRequest{ContainerId: "../x", Signal: 9})
	wantCode(t, err, codes.InvalidArgument, "container id")
	_, err = h.client.CreateContainer(ctx, &protocol.CreateContainerRequest{ContainerId: "bad", Spec: []byte("{not json")})
	wantCode(t, err, codes.InvalidArgument, "decode OCI spec")
	s := testSpec(root, "true")
	s.Process.Cwd = "relative"
	wantCode(t, create("bad", s), codes.InvalidArgument, "process.cwd")
	wantCode(t, create("bad", testSpec(filepath.Join(root, "missing"), "true")), codes.NotFound, "is not a directory (is its disk mounted?)")
	_, err = h.client.MountDisk(ctx, &protocol.MountDiskRequest{Serial: "no-such-disk"})
	wantCode(t, err, codes.NotFound, `no block device with serial "no-such-disk"`)
	_, err = h.client.MountDisk(ctx, &protocol.MountDiskRequest{Serial: "a/b"})
	wantCode(t, err, codes.InvalidArgument, "disk serial")
	_, err = h.client.PowerOff(ctx, &protocol.PowerOffRequest{})
	wantCode(t, err, codes.Unavailable, "only available when the agent is the guest's init")
	_, err = h.client.ReseedRandom(ctx, &protocol.ReseedRandomRequest{Entropy: []byte("short")})
	wantCode(t, err, codes.InvalidArgument, "entropy is 5 bytes")
	_, err = h.client.ReadFile(ctx, &protocol.ReadFileRequest{ContainerId: "nope", Path: "/x"})
	wantCode(t, err, codes.NotFound, `container "nope" not found`)

	// A bad stream header gets an error reply, not a hang or a crash.
	c, err := net.Dial("unix", h.streamSock)
	if err != nil {
		t.Fatal(err)
	}
	err = protocol.OpenStream(c, protocol.StreamHeader{ContainerID: "nope", Stream: protocol.Stdout})
	if err == nil || !strings.Contains(err.Error(), `container "nope" not found`) {
		t.Errorf("stream to unknown container: %v", err)
	}
	c.Close()

	if os.Geteuid() == 0 {
		// Errors found by the container helper inside the new namespaces.
		root := makeRootfs(t)
		wantCode(t, create("bad", testSpec(root, "/bin/notexec")), codes.InvalidArgument, `"/bin/notexec" is not executable`)
		wantCode(t, create("bad", testSpec(root, "no-such-cmd")), codes.NotFound, `"no-such-cmd" not found in PATH`)
		wantCode(t, create("bad", testSpec(root, "/bin")), codes.InvalidArgument, "is a directory")
		s = testSpec(root, "true")
		s.Process.Cwd = "/does/not/exist"
		wantCode(t, create("bad", s), codes.NotFound, `cwd "/does/not/exist" does not exist`)
		h.create("dup", testSpec(root, "true"), nil)
		wantCode(t, create("dup", testSpec(root, "true")), codes.AlreadyExists, `container "dup"`)
		_, err = h.client.ExecProcess(ctx, &protocol.ExecProcessRequest{ContainerId: "dup", ExecId: "e", Process: []byte(`{"args":["true"],"cwd":"/"}`)})
		wantCode(t, err, codes.FailedPrecondition, "is created; exec needs it running")
		_, err = h.client.Signal(ctx, &protocol.SignalRequest{ContainerId: "dup", Signal: 9})
		wantCode(t, err, codes.FailedPrecondition, "not started")
	} else {
		t.Log("not root: helper-side errors (non-executable, missing command, bad cwd) not exercised")
	}

	// And the agent is still there.
	if r, err := h.client.Health(ctx, &protocol.HealthRequest{}); err != nil || !r.Ok {
		t.Fatalf("health after bad requests: %v %v", r, err)
	}
}

func TestFilesInsideContainerRoot(t *testing.T) {
	needRoot(t)
	h := newHarness(t, nil)
	root := makeRootfs(t)
	// A symlink that would escape a naive join of rootfs and path.
	os.Symlink("/../../../../../../etc", filepath.Join(root, "escape"))
	h.create("f", testSpec(root, "sleep", "1000"), nil)
	h.start("f", "")
	ctx := context.Background()
	if _, err := h.client.WriteFile(ctx, &protocol.WriteFileRequest{ContainerId: "f", Path: "/data/sub/hello.txt", Data: []byte("hi "), MakeParents: true, Mode: 0o600}); err != nil {
		t.Fatal(err)
	}
	if w, err := h.client.WriteFile(ctx, &protocol.WriteFileRequest{ContainerId: "f", Path: "/data/sub/hello.txt", Data: []byte("there"), Append: true}); err != nil || w.Size != 8 {
		t.Fatalf("append: %v %v", w, err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "data/sub/hello.txt")); err != nil || string(b) != "hi there" {
		t.Fatalf("file on rootfs: %q %v", b, err)
	}
	r, err := h.client.ReadFile(ctx, &protocol.ReadFileRequest{ContainerId: "f", Path: "/data/sub/hello.txt", Offset: 3})
	if err != nil || string(r.Data) != "there" || !r.Eof || r.Size != 8 || r.Mode != 0o600 {
		t.Fatalf("read: %+v %v", r, err)
	}
	// /tmp is a tmpfs mounted inside the container: only visible through
	// the container's root.
	if _, err := h.client.WriteFile(ctx, &protocol.WriteFileRequest{ContainerId: "f", Path: "/tmp/in-tmpfs", Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "tmp/in-tmpfs")); !os.IsNotExist(err) {
		t.Errorf("file written into container tmpfs appeared on the rootfs: %v", err)
	}
	_, err = h.client.ReadFile(ctx, &protocol.ReadFileRequest{ContainerId: "f", Path: "/escape/hostname"})
	wantCode(t, err, codes.NotFound, "read /escape/hostname")
	_, err = h.client.ReadFile(ctx, &protocol.ReadFileRequest{ContainerId: "f", Path: "/nope"})
	wantCode(t, err, codes.NotFound, "read /nope")
	_, err = h.client.ReadFile(ctx, &protocol.ReadFileRequest{ContainerId: "f", Path: "relative"})
	wantCode(t, err, codes.InvalidArgument, "must be absolute")
	_, err = h.client.ReadFile(ctx, &protocol.ReadFileRequest{ContainerId: "f", Path: "/bin"})
	wantCode(t, err, codes.InvalidArgument, "is a directory")
}

func TestClockAndRandom(t *testing.T) {
	var got time.Time
	h := newHarness(t, func(c *Config) {
		// Never step the host's clock from a test.
		c.SetClock = func(t time.Time) error { got = t; return nil }
	})
	ctx := context.Background()
	want := time.Unix(1_800_000_000, 123)
	if _, err := h.client.SetTime(ctx, &protocol.SetTimeRequest{UnixNano: want.UnixNano()}); err != nil || !got.Equal(want) {
		t.Fatalf("SetTime: clock set to %v (%v), want %v", got, err, want)
	}
	_, err := h.client.SetTime(ctx, &protocol.SetTimeRequest{UnixNano: -1})
	wantCode(t, err, codes.InvalidArgument, "not after the epoch")
	if os.Geteuid() != 0 {
		t.Skip("RNDADDENTROPY needs CAP_SYS_ADMIN (root)")
	}
	if _, err := h.client.ReseedRandom(ctx, &protocol.ReseedRandomRequest{Entropy: bytes.Repeat([]byte{0xa5}, 64)}); err != nil {
		t.Fatalf("ReseedRandom: %v", err)
	}
	if hr, err := h.client.Health(ctx, &protocol.HealthRequest{}); err != nil || hr.RngReseeds != 1 {
		t.Fatalf("health after ReseedRandom: %v %v, want rng_reseeds 1", hr, err)
	}
}

// Freshen checks both fields before it changes anything, steps the clock,
// reseeds, and mounts when asked; a failed mount leaves the clock and RNG
// freshened (TestFreshenMountsDisk mounts a real disk).
func TestFreshen(t *testing.T) {
	var got time.Time
	h := newHarness(t, func(c *Config) {
		c.SetClock = func(t time.Time) error { got = t; return nil } // never the host's clock
		c.SysBlock = t.TempDir()                                     // no disks
	})
	ctx := context.Background()
	want := time.Unix(1_800_000_000, 7)
	_, err := h.client.Freshen(ctx, &protocol.FreshenRequest{UnixNano: want.UnixNano(), Entropy: []byte("short")})
	wantCode(t, err, codes.InvalidArgument, "entropy is 5 bytes")
	if !got.IsZero() {
		t.Fatalf("a refused Freshen set the clock to %v", got)
	}
	_, err = h.client.Freshen(ctx, &protocol.FreshenRequest{Entropy: make([]byte, 32)})
	wantCode(t, err, codes.InvalidArgument, "not after the epoch")
	if os.Geteuid() != 0 {
		t.Skip("RNDADDENTROPY needs CAP_SYS_ADMIN (root)")
	}
	r, err := h.client.Freshen(ctx, &protocol.FreshenRequest{UnixNano: want.UnixNano(), Entropy: bytes.Repeat([]byte{0x5a}, 64)})
	if err != nil || r.Mount != nil || !got.Equal(want) {
		t.Fatalf("Freshen: %v %v, clock %v; want no mount, clock %v", r, err, got, want)
	}
	got = time.Time{}
	_, err = h.client.Freshen(ctx, &protocol.FreshenRequest{UnixNano: want.UnixNano(), Entropy: make([]byte, 16),
		Mount: &protocol.MountDiskRequest{Serial: "cube-no-such-disk"}})
	wantCode(t, err, codes.NotFound, "cube-no-such-disk")
	if !got.Equal(want) {
		t.Errorf("clock after a Freshen whose mount failed: %v, want %v", got, want)
	}
	if hr, err := h.client.Health(ctx, &protocol.HealthRequest{}); err != nil || hr.RngReseeds != 2 {
		t.Fatalf("health after two Freshens: %v %v, want rng_reseeds 2", hr, err)
	}
}

func TestVersionAndHealth(t *testing.T) {
	h := newHarness(t, nil)
	v, err := h.client.Version(context.Background(), &protocol.VersionRequest{})
	if err != nil || v.ProtocolVersion != protocol.ProtocolVersion || v.KernelRelease == "" {
		t.Fatalf("version: %v %v", v, err)
	}
}

// After a VM restore every connection is reset; the agent must keep its
// processes and serve new connections.
func TestSurvivesConnectionReset(t *testing.T) {
	needRoot(t)
	h := newHarness(t, nil)
	h.create("r", testSpec(makeRootfs(t), "sleep", "1000"), nil)
	h.start("r", "")
	h.conn.Close()
	h.svc.NoteTransportReset()
	h.dial()
	hr, err := h.client.Health(context.Background(), &protocol.HealthRequest{})
	if err != nil || hr.TransportResets != 1 {
		t.Fatalf("health after reset: %v %v", hr, err)
	}
	st, err := h.client.State(context.Background(), &protocol.StateRequest{ContainerId: "r"})
	if err != nil || st.Status != "running" {
		t.Fatalf("container after reset: %v %v", st, err)
	}
}

type errConn struct {
	net.Conn
	err error
}

func (c errConn) Read([]byte) (int, error) { return 0, c.err }

func TestResetConnReportsECONNRESET(t *testing.T) {
	n := 0
	c := &resetConn{Conn: errConn{err: &net.OpError{Op: "read", Err: os.NewSyscallError("read", errECONNRESET)}}, onReset: func() { n++ }}
	c.Read(nil)
	c2 := &resetConn{Conn: errConn{err: io.EOF}, onReset: func() { n++ }}
	c2.Read(nil)
	// What a read on a socket the virtio-vsock transport reset returns.
	c3 := &resetConn{Conn: errConn{err: &net.OpError{Op: "read", Err: os.NewSyscallError("read", unix.ENOTCONN)}}, onReset: func() { n++ }}
	c3.Read(nil)
	if n != 2 {
		t.Fatalf("onReset called %d times, want 2 (ECONNRESET and ENOTCONN, not EOF)", n)
	}
}

// eofConn reads io.EOF (what github.com/mdlayher/vsock makes of a reset socket's ENOTCONN) while its file
// descriptor is a real socket.
type eofConn struct{ *net.TCPConn }

func (eofConn) Read([]byte) (int, error) { return 0, io.EOF }

// A read that ends in io.EOF counts as a reset only when the socket's pending error (SO_ERROR) is ECONNRESET.
func TestResetConnChecksSOError(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	pair := func() (*net.TCPConn, *net.TCPConn) {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.TCPConn), s.(*net.TCPConn)
	}
	n := 0
	// Orderly close: EOF, no pending error.
	a, b := pair()
	b.Close()
	time.Sleep(50 * time.Millisecond)
	(&resetConn{Conn: eofConn{a}, onReset: func() { n++ }}).Read(nil)
	a.Close()
	if n != 0 {
		t.Fatalf("orderly close counted as a reset")
	}
	// RST (SO_LINGER 0): the pending error is ECONNRESET.
	a, b = pair()
	b.SetLinger(0)
	b.Close()
	time.Sleep(50 * time.Millisecond)
	(&resetConn{Conn: eofConn{a}, onReset: func() { n++ }}).Read(nil)
	a.Close()
	if n != 1 {
		t.Fatalf("a socket with SO_ERROR ECONNRESET was not counted as a reset")
	}
}

func TestCapabilities(t *testing.T) {
	needRoot(t)
	h := newHarness(t, nil)
	root := makeRootfs(t)
	os.Symlink("busybox", filepath.Join(root, "bin", "grep"))
	caps := []string{"CAP_NET_BIND_SERVICE", "CAP_KILL"} // bits 10 and 5: 0x420
	run := func(id string, uid uint32, ambient []string) string {
		spec := testSpec(root, "grep", "-E", "^Cap(Eff|Bnd|Amb)", "/proc/self/status")
		spec.Process.User.UID = uid
		spec.Process.Capabilities = &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps, Inheritable: caps, Ambient: ambient}
		h.create(id, spec, &protocol.Stdio{Stdout: true})
		out := h.stream(id, "", protocol.Stdout)
		h.start(id, "")
		return strings.Join(strings.Fields(readAll(t, out)), " ")
	}
	if got, want := run("capsroot", 0, nil), "CapEff: 0000000000000420 CapBnd: 0000000000000420 CapAmb: 0000000000000000"; got != want {
		t.Errorf("root: %q, want %q", got, want)
	}
	if got, want := run("capsuser", 1000, caps), "CapEff: 0000000000000420 CapBnd: 0000000000000420 CapAmb: 0000000000000420"; got != want {
		t.Errorf("uid 1000 with ambient caps: %q, want %q", got, want)
	}
	spec := testSpec(root, "true")
	spec.Process.Capabilities = &specs.LinuxCapabilities{Bounding: []string{"CAP_FLY"}}
	_, err := h.client.CreateContainer(context.Background(), &protocol.CreateContainerRequest{ContainerId: "badcap", Spec: specJSON(t, spec)})
	wantCode(t, err, codes.InvalidArgument, `unknown capability "CAP_FLY"`)
}

func TestSignalAllAndListPids(t *testing.T) {
	t.Run("cgroup", func(t *testing.T) { testSignalAll(t, nil) })
	t.Run("process-tree", func(t *testing.T) { testSignalAll(t, func(c *Config) { c.CgroupRoot = "-" }) })
}

func testSignalAll(t *testing.T, mod func(*Config)) {
	needRoot(t)
	h := newHarness(t, mod)
	// No pid namespace: killing the init alone would leave its children.
	spec := testSpec(makeRootfs(t), "sh", "-c", "sleep 1000 & a=$!; sleep 1000 & echo started $a $!; wait")
	spec.Linux.Namespaces = []specs.LinuxNamespace{{Type: specs.MountNamespace}, {Type: specs.UTSNamespace}}
	spec.Mounts = spec.Mounts[1:] // no /proc of a pid namespace we do not have
	h.create("all", spec, &protocol.Stdio{Stdout: true})
	out := h.stream("all", "", protocol.Stdout)
	h.start("all", "")
	var a, b int
	out.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := fmt.Fscanf(out, "started %d %d\n", &a, &b); err != nil {
		t.Fatal(err)
	}
	// The shell printed the children's pids after forking them; poll until
	// /proc shows them (a fresh child may not be listed for a moment).
	var pids *protocol.ListPidsResponse
	deadline := time.Now().Add(time.Minute)
	for {
		var err error
		pids, err = h.client.ListPids(context.Background(), &protocol.ListPidsRequest{ContainerId: "all"})
		if err != nil {
			t.Fatal(err)
		}
		has := map[uint32]bool{}
		for _, p := range pids.Pids {
			has[p] = true
		}
		if has[uint32(a)] && has[uint32(b)] && len(pids.Pids) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ListPids = %v; want the shell and children %d, %d", pids.Pids, a, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := h.client.Signal(context.Background(), &protocol.SignalRequest{ContainerId: "all", Signal: 9, All: true}); err != nil {
		t.Fatal(err)
	}
	if w := h.wait("all", ""); w.ExitStatus != 137 {
		t.Errorf("exit %d, want 137", w.ExitStatus)
	}
	for _, p := range pids.Pids {
		deadline := time.Now().Add(time.Minute)
		for {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", p)); os.IsNotExist(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pid %d survived a kill of all", p)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// A daemon that double-forks is reparented to the agent, out of its
// container's process tree; the container's cgroup still holds it.
func TestCgroupKeepsDaemonsOfDeletedContainer(t *testing.T) {
	needRoot(t)
	h := newHarness(t, nil)
	if h.svc.cfg.CgroupRoot == "" {
		t.Skip("no cgroup2 hierarchy could be mounted")
	}
	spec := testSpec(makeRootfs(t), "sh", "-c", "(sleep 1000 & echo $! >&2); echo started; sleep 1000")
	spec.Linux.Namespaces = []specs.LinuxNamespace{{Type: specs.MountNamespace}}
	spec.Mounts = spec.Mounts[1:]
	spec.Hostname = ""
	h.create("daemon", spec, &protocol.Stdio{Stdout: true, Stderr: true})
	out := h.stream("daemon", "", protocol.Stdout)
	errs := h.stream("daemon", "", protocol.Stderr)
	h.start("daemon", "")
	var daemon int
	errs.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := fmt.Fscanf(errs, "%d\n", &daemon); err != nil {
		t.Fatal(err)
	}
	out.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := fmt.Fscanf(out, "started\n"); err != nil {
		t.Fatal(err)
	}
	pids, err := h.client.ListPids(context.Background(), &protocol.ListPidsRequest{ContainerId: "daemon"})
	found := false
	for _, p := range pids.GetPids() {
		found = found || int(p) == daemon
	}
	if err != nil || !found {
		t.Fatalf("ListPids = %v, %v; want it to include the daemon %d", pids, err, daemon)
	}
	cgPath := h.svc.containers["daemon"].cgroup.path
	if _, err := h.client.Delete(context.Background(), &protocol.DeleteRequest{ContainerId: "daemon", Force: true}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", daemon))
		if err != nil || strings.Contains(string(b), ") Z ") {
			break // gone, or dead and waiting for the reaper
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon %d survived deleting its container: %s", daemon, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := os.Stat(cgPath); !os.IsNotExist(err) {
		t.Errorf("container cgroup %s left behind: %v", cgPath, err)
	}
}
