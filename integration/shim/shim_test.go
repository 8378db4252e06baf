package shim

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	apitask "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/fifo"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/cube-runtime/cube/integration/cubetest"
	"github.com/cube-runtime/cube/integration/sandboxenv"
	"github.com/cube-runtime/cube/shim/config"
	"github.com/cube-runtime/cube/shim/task"
)

type recorder struct {
	mu     sync.Mutex
	topics []string
}

func (r *recorder) Publish(ctx context.Context, topic string, ev events.Event) error {
	r.mu.Lock()
	r.topics = append(r.topics, topic)
	r.mu.Unlock()
	return nil
}

type env struct {
	t        *testing.T
	ctx      context.Context
	svc      *task.Service
	events   *recorder
	stateDir string
}

func newEnv(t *testing.T) *env {
	logrus.SetLevel(logrus.DebugLevel)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	e := &env{t: t, ctx: ctx, events: &recorder{}, stateDir: t.TempDir()}
	e.svc = task.New(task.Options{
		Namespace: "e2e",
		Publisher: e.events,
		LoadConfig: func(string) (config.Config, error) {
			c := config.Default()
			c.VMM, c.Kernel, c.Initrd = cubetest.CubeVMM, cubetest.GuestKernel, cubetest.GuestInitrd
			// After "--" the kernel hands the rest to /init: the agent logs at debug level.
			c.Cmdline = "console=ttyS0 panic=-1 quiet -- -debug"
			c.StateDir = e.stateDir
			c.DiskSlots = 2
			// TCG-emulated test host: the guest boots in tens of seconds.
			c.BootTimeout = "5m"
			return c, c.Validate()
		},
	})
	return e
}

func processSpec(args ...string) *specs.Process {
	return &specs.Process{Args: args, Cwd: "/", Env: []string{"PATH=/bin"}}
}

// bundle writes config.json and a private copy of the rootfs image.
func (e *env) bundle(id string, args ...string) (string, string) {
	dir := filepath.Join(e.t.TempDir(), id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	b, _ := json.Marshal(&specs.Spec{
		Version: specs.Version, Process: processSpec(args...), Hostname: id, Root: &specs.Root{Path: "rootfs"},
		Mounts: []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}, {Destination: "/tmp", Type: "tmpfs", Source: "tmpfs"}},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
			{Type: specs.MountNamespace}, {Type: specs.PIDNamespace}, {Type: specs.UTSNamespace}, {Type: specs.IPCNamespace},
		}},
	})
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		e.t.Fatal(err)
	}
	img, err := os.ReadFile(cubetest.RootfsImage)
	if err != nil {
		e.t.Fatal(err)
	}
	image := filepath.Join(dir, "rootfs.img")
	if err := os.WriteFile(image, img, 0o644); err != nil {
		e.t.Fatal(err)
	}
	return dir, image
}

type stdio struct {
	in         io.WriteCloser
	out        *bufio.Reader
	outF, errF io.Closer
	inP, outP  string
	errP       string
}

func (e *env) fifos(withStdin bool) *stdio {
	dir := e.t.TempDir()
	s := &stdio{outP: filepath.Join(dir, "out"), errP: filepath.Join(dir, "err")}
	rd := syscall.O_RDONLY | syscall.O_CREAT | syscall.O_NONBLOCK
	of, err := fifo.OpenFifo(e.ctx, s.outP, rd, 0o700)
	if err != nil {
		e.t.Fatal(err)
	}
	ef, err := fifo.OpenFifo(e.ctx, s.errP, rd, 0o700)
	if err != nil {
		e.t.Fatal(err)
	}
	go io.Copy(os.Stderr, ef) // container stderr into the test log
	s.out, s.outF, s.errF = bufio.NewReader(of), of, ef
	if withStdin {
		s.inP = filepath.Join(dir, "in")
		if s.in, err = fifo.OpenFifo(e.ctx, s.inP, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_NONBLOCK, 0o700); err != nil {
			e.t.Fatal(err)
		}
	}
	e.t.Cleanup(func() { of.Close(); ef.Close() })
	return s
}

func (e *env) line(s *stdio) string {
	l, err := s.out.ReadString('\n')
	if err != nil {
		e.dumpConsoles()
		e.t.Fatalf("read container output: %v (got %q)", err, l)
	}
	return strings.TrimSuffix(l, "\n")
}

// dumpConsoles logs every sandbox VM's console (the agent logs there).
func (e *env) dumpConsoles() {
	logs, _ := filepath.Glob(filepath.Join(e.stateDir, "*", "console.log"))
	for _, p := range logs {
		b, _ := os.ReadFile(p)
		e.t.Logf("--- %s ---\n%s", p, b)
	}
}

func (e *env) must(what string, err error) {
	e.t.Helper()
	if err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
}

func (e *env) wait(id, exec string) uint32 {
	e.t.Helper()
	r, err := e.svc.Wait(e.ctx, &taskAPI.WaitRequest{ID: id, ExecID: exec})
	e.must("wait "+id+"/"+exec, err)
	return r.ExitStatus
}

func (e *env) exec(id, execID string, s *stdio, args ...string) {
	e.t.Helper()
	b, _ := json.Marshal(processSpec(args...))
	req := &taskAPI.ExecProcessRequest{ID: id, ExecID: execID, Spec: &anypb.Any{Value: b}}
	if s != nil {
		req.Stdin, req.Stdout, req.Stderr = s.inP, s.outP, s.errP
	}
	_, err := e.svc.Exec(e.ctx, req)
	e.must("exec "+execID, err)
	_, err = e.svc.Start(e.ctx, &taskAPI.StartRequest{ID: id, ExecID: execID})
	e.must("start "+execID, err)
}

// TestContainerLifecycleInMicroVM: one sandbox VM, its container's output and
// exit codes, exec with stdin, signals, pause/resume, and delete powering
// the VM off and removing its state.
func TestContainerLifecycleInMicroVM(t *testing.T) {
	e := newEnv(t)
	bundle, image := e.bundle("c1", "sh", "-c", "echo hello from $(hostname); cat /etc/motd; exec sleep 600")
	out := e.fifos(false)
	start := time.Now()
	_, err := e.svc.Create(e.ctx, &taskAPI.CreateTaskRequest{ID: "c1", Bundle: bundle, Stdout: out.outP, Stderr: out.errP,
		Rootfs: []*types.Mount{{Type: "ext4", Source: image, Options: []string{"loop", "rw"}}}})
	e.must("create", err)
	t.Logf("create (VM boot + agent + container) took %v", time.Since(start))
	_, err = e.svc.Start(e.ctx, &taskAPI.StartRequest{ID: "c1"})
	e.must("start", err)
	if l := e.line(out); l != "hello from c1" {
		t.Fatalf("first line %q", l)
	}
	if l := e.line(out); l+"\n" != sandboxenv.Motd {
		t.Fatalf("second line %q", l)
	}

	ex := e.fifos(false)
	e.exec("c1", "e1", ex, "sh", "-c", "echo exec here; exit 3")
	if l := e.line(ex); l != "exec here" {
		t.Fatalf("exec output %q", l)
	}
	if st := e.wait("c1", "e1"); st != 3 {
		t.Fatalf("exec exit %d, want 3", st)
	}

	in := e.fifos(true)
	e.exec("c1", "cat", in, "cat")
	io.WriteString(in.in, "through stdin\n")
	in.in.Close()
	_, err = e.svc.CloseIO(e.ctx, &taskAPI.CloseIORequest{ID: "c1", ExecID: "cat", Stdin: true})
	e.must("closeio", err)
	if l := e.line(in); l != "through stdin" {
		t.Fatalf("cat output %q", l)
	}
	if st := e.wait("c1", "cat"); st != 0 {
		t.Fatalf("cat exit %d", st)
	}

	e.exec("c1", "term", nil, "sleep", "600")
	_, err = e.svc.Kill(e.ctx, &taskAPI.KillRequest{ID: "c1", ExecID: "term", Signal: uint32(syscall.SIGTERM)})
	e.must("kill", err)
	if st := e.wait("c1", "term"); st != 143 {
		t.Fatalf("SIGTERM exit %d, want 143", st)
	}

	_, err = e.svc.Pause(e.ctx, &taskAPI.PauseRequest{ID: "c1"})
	e.must("pause", err)
	st, err := e.svc.State(e.ctx, &taskAPI.StateRequest{ID: "c1"})
	e.must("state", err)
	if st.Status != apitask.Status_PAUSED {
		t.Fatalf("state %v", st.Status)
	}
	_, err = e.svc.Resume(e.ctx, &taskAPI.ResumeRequest{ID: "c1"})
	e.must("resume", err)
	pids, err := e.svc.Pids(e.ctx, &taskAPI.PidsRequest{ID: "c1"})
	e.must("pids after resume", err)
	if len(pids.Processes) == 0 {
		t.Fatal("no guest pids")
	}

	_, err = e.svc.Kill(e.ctx, &taskAPI.KillRequest{ID: "c1", Signal: uint32(syscall.SIGKILL)})
	e.must("kill init", err)
	if st := e.wait("c1", ""); st != 137 {
		t.Fatalf("init exit %d, want 137", st)
	}
	_, err = e.svc.Delete(e.ctx, &taskAPI.DeleteRequest{ID: "c1"})
	e.must("delete", err)
	if ents, _ := os.ReadDir(e.stateDir); len(ents) != 0 {
		t.Fatalf("sandbox state left: %v", ents)
	}
	e.must("flush events", e.svc.FlushEvents(e.ctx))
	t.Logf("events: %v", e.events.topics)
}

// TestVMMKilled: SIGKILL to cube-vmm ends the task with 137 and an exit
// event, and cleans the sandbox's sockets and stubs.
func TestVMMKilled(t *testing.T) {
	e := newEnv(t)
	bundle, image := e.bundle("c2", "sleep", "600")
	_, err := e.svc.Create(e.ctx, &taskAPI.CreateTaskRequest{ID: "c2", Bundle: bundle,
		Rootfs: []*types.Mount{{Type: "ext4", Source: image, Options: []string{"loop", "rw"}}}})
	e.must("create", err)
	_, err = e.svc.Start(e.ctx, &taskAPI.StartRequest{ID: "c2"})
	e.must("start", err)
	c, err := e.svc.Connect(e.ctx, &taskAPI.ConnectRequest{ID: "c2"})
	e.must("connect", err)
	if err := syscall.Kill(int(c.TaskPid), syscall.SIGKILL); err != nil {
		t.Fatalf("kill vmm pid %d: %v", c.TaskPid, err)
	}
	if st := e.wait("c2", ""); st != 137 {
		t.Fatalf("exit after vmm kill %d, want 137", st)
	}
	if ents, _ := os.ReadDir(e.stateDir); len(ents) != 0 {
		t.Fatalf("sandbox state left after vmm death: %v", ents)
	}
	_, err = e.svc.Delete(e.ctx, &taskAPI.DeleteRequest{ID: "c2"})
	e.must("delete", err)
	e.must("flush events", e.svc.FlushEvents(e.ctx)) // events go out asynchronously
	found := false
	for _, tp := range e.events.topics {
		found = found || tp == "/tasks/exit"
	}
	if !found {
		t.Fatalf("no exit event: %v", e.events.topics)
	}
}
