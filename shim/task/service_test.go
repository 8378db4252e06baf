package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	cgroupsv1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	cgroupsv2stats "github.com/containerd/cgroups/v3/cgroup2/stats"
	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/api/types/runc/options"
	apitask "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/core/runtime"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/fifo"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/cube-runtime/cube/shim/config"
	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/sandbox/sandboxtest"
)

type event struct {
	topic string
	ev    events.Event
}

type recorder struct {
	mu     sync.Mutex
	events []event
}

func (r *recorder) Publish(ctx context.Context, topic string, ev events.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, event{topic, ev})
	return nil
}

func (r *recorder) topics() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var t []string
	for _, e := range r.events {
		t = append(t, e.topic)
	}
	return t
}

func (r *recorder) find(topic string) []events.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []events.Event
	for _, e := range r.events {
		if e.topic == topic {
			out = append(out, e.ev)
		}
	}
	return out
}

type shutdownRecorder struct {
	mu    sync.Mutex
	calls int
}

func (s *shutdownRecorder) Shutdown() {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
}
func (s *shutdownRecorder) RegisterCallback(func(context.Context) error) {}
func (s *shutdownRecorder) Done() <-chan struct{}                        { return nil }
func (s *shutdownRecorder) Err() error                                   { return nil }

type harness struct {
	t        testing.TB
	ctx      context.Context
	svc      *Service
	agent    *sandboxtest.Agent
	vmm      *sandboxtest.VMM
	events   *recorder
	shutdown *shutdownRecorder
	stateDir string
	boots    int
	cgroup   string // the fake VMM's cgroup, if set
	// hostBlock, when set, resolves host block devices for the sandbox.
	hostBlock func(major, minor uint32) (string, uint64, error)
}

func newHarness(t testing.TB) *harness {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	h := &harness{t: t, ctx: ctx, agent: sandboxtest.NewAgent(), events: &recorder{}, shutdown: &shutdownRecorder{}, stateDir: t.TempDir()}
	h.vmm = sandboxtest.NewVMM(h.agent)
	h.svc = New(Options{
		Namespace: "test",
		Publisher: h.events,
		Shutdown:  h.shutdown,
		LoadConfig: func(path string) (config.Config, error) {
			c := config.Default()
			c.StateDir = h.stateDir
			c.DiskSlots = 3
			return c, nil
		},
		NewSandbox: func(ctx context.Context, id string, cfg config.Config, spec *specs.Spec, bundle string) (*sandbox.Sandbox, error) {
			h.boots++
			return sandbox.New(sandbox.Options{
				ID: id, Dir: SandboxDir(cfg.StateDir, "test", id), Kernel: cfg.Kernel, MemoryMiB: cfg.MemoryMiB,
				VCPUs: cfg.VCPUs, DiskSlots: int(cfg.DiskSlots), BootTimeout: time.Second,
				VMM: h.vmm, Dial: sandboxtest.Dialer(h.agent), Cgroup: h.cgroup, HostBlockDevice: h.hostBlock,
			})
		},
	})
	return h
}

// bundle writes an OCI bundle whose process runs args.
func (h *harness) bundle(id string, args []string, terminal bool, ann map[string]string) string {
	h.t.Helper()
	dir := filepath.Join(h.t.TempDir(), id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		h.t.Fatal(err)
	}
	spec := specs.Spec{Version: specs.Version, Process: &specs.Process{Args: args, Terminal: terminal, Cwd: "/"},
		Root: &specs.Root{Path: "rootfs"}, Annotations: ann}
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		h.t.Fatal(err)
	}
	return dir
}

func rootfs(image string) []*types.Mount {
	return []*types.Mount{{Type: "ext4", Source: image, Options: []string{"loop", "rw"}}}
}

// fifos creates containerd-style stdio fifos, the client's ends opened.
type fifos struct {
	stdin                    io.WriteCloser
	stdout, stderr           io.ReadCloser
	inPath, outPath, errPath string
}

func (h *harness) fifos(withStdin bool) *fifos {
	h.t.Helper()
	dir := h.t.TempDir()
	f := &fifos{outPath: filepath.Join(dir, "out"), errPath: filepath.Join(dir, "err")}
	var err error
	rd := syscall.O_RDONLY | syscall.O_CREAT | syscall.O_NONBLOCK
	if f.stdout, err = fifo.OpenFifo(h.ctx, f.outPath, rd, 0o700); err != nil {
		h.t.Fatal(err)
	}
	if f.stderr, err = fifo.OpenFifo(h.ctx, f.errPath, rd, 0o700); err != nil {
		h.t.Fatal(err)
	}
	if withStdin {
		f.inPath = filepath.Join(dir, "in")
		if f.stdin, err = fifo.OpenFifo(h.ctx, f.inPath, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_NONBLOCK, 0o700); err != nil {
			h.t.Fatal(err)
		}
	}
	h.t.Cleanup(func() {
		for _, c := range []io.Closer{f.stdin, f.stdout, f.stderr} {
			if c != nil {
				c.Close()
			}
		}
	})
	return f
}

// topics and find read the events once every event queued so far has been
// handed to the publisher (events go out asynchronously).
func (h *harness) topics() []string {
	h.t.Helper()
	h.flushEvents()
	return h.events.topics()
}

func (h *harness) find(topic string) []events.Event {
	h.t.Helper()
	h.flushEvents()
	return h.events.find(topic)
}

func (h *harness) flushEvents() {
	h.t.Helper()
	if err := h.svc.FlushEvents(h.ctx); err != nil {
		h.t.Fatalf("flush events: %v", err)
	}
}

func (h *harness) create(id string, args []string, f *fifos, ann map[string]string) *taskAPI.CreateTaskResponse {
	h.t.Helper()
	req := &taskAPI.CreateTaskRequest{ID: id, Bundle: h.bundle(id, args, false, ann), Rootfs: rootfs("/images/" + id + ".ext4")}
	if f != nil {
		req.Stdin, req.Stdout, req.Stderr = f.inPath, f.outPath, f.errPath
	}
	resp, err := h.svc.Create(h.ctx, req)
	if err != nil {
		h.t.Fatalf("create %s: %v", id, err)
	}
	return resp
}

func (h *harness) start(id, exec string) {
	h.t.Helper()
	if _, err := h.svc.Start(h.ctx, &taskAPI.StartRequest{ID: id, ExecID: exec}); err != nil {
		h.t.Fatalf("start %s/%s: %v", id, exec, err)
	}
}

func (h *harness) wait(id, exec string) uint32 {
	h.t.Helper()
	r, err := h.svc.Wait(h.ctx, &taskAPI.WaitRequest{ID: id, ExecID: exec})
	if err != nil {
		h.t.Fatalf("wait %s/%s: %v", id, exec, err)
	}
	if r.ExitedAt == nil {
		h.t.Errorf("wait %s/%s: no exit time", id, exec)
	}
	return r.ExitStatus
}

func (h *harness) state(id, exec string) apitask.Status {
	h.t.Helper()
	r, err := h.svc.State(h.ctx, &taskAPI.StateRequest{ID: id, ExecID: exec})
	if err != nil {
		h.t.Fatalf("state %s/%s: %v", id, exec, err)
	}
	return r.Status
}

func (h *harness) delete(id, exec string) *taskAPI.DeleteResponse {
	h.t.Helper()
	r, err := h.svc.Delete(h.ctx, &taskAPI.DeleteRequest{ID: id, ExecID: exec})
	if err != nil {
		h.t.Fatalf("delete %s/%s: %v", id, exec, err)
	}
	return r
}

func wantCode(t *testing.T, err error, code codes.Code, substr string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want %v error containing %q, got nil", code, substr)
	}
	if c := status.Code(err); c != code {
		t.Fatalf("error %v: code %v, want %v", err, c, code)
	}
	if !strings.Contains(err.Error(), substr) {
		t.Fatalf("error %q lacks %q", err, substr)
	}
}

func readAll(t testing.TB, r io.Reader) string {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestRunPrintsOutputAndExitsZero(t *testing.T) {
	h := newHarness(t)
	f := h.fifos(false)
	resp := h.create("c1", []string{"echo", "hello", "cube"}, f, nil)
	if resp.Pid == 0 {
		t.Fatal("create returned pid 0")
	}
	if got := h.state("c1", ""); got != apitask.Status_CREATED {
		t.Fatalf("state after create %v", got)
	}
	// The rootfs image went to the VM as slot 0's disk and was mounted in the guest.
	if got := h.vmm.Config.Disks[0]; got.Path != "/images/c1.ext4" || got.Serial != "cube-slot-0" {
		t.Fatalf("slot 0 = %+v", got)
	}
	h.start("c1", "")
	if got := readAll(t, f.stdout); got != "hello cube\n" {
		t.Fatalf("stdout %q", got)
	}
	if st := h.wait("c1", ""); st != 0 {
		t.Fatalf("exit status %d", st)
	}
	if got := h.state("c1", ""); got != apitask.Status_STOPPED {
		t.Fatalf("state after exit %v", got)
	}
	d := h.delete("c1", "")
	if d.ExitStatus != 0 || d.Pid != resp.Pid {
		t.Fatalf("delete %+v", d)
	}
	want := []string{runtime.TaskCreateEventTopic, runtime.TaskStartEventTopic, runtime.TaskExitEventTopic, runtime.TaskDeleteEventTopic}
	if got := h.topics(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("events %v, want %v", got, want)
	}
	// Deleting the last container powers the VM off and removes its state dir.
	select {
	case <-h.vmm.Wait():
	default:
		t.Fatal("vmm still running after the last delete")
	}
	if _, err := os.Stat(SandboxDir(h.stateDir, "test", "c1")); !os.IsNotExist(err) {
		t.Fatalf("sandbox dir left behind: %v", err)
	}
	if _, err := h.svc.Shutdown(h.ctx, &taskAPI.ShutdownRequest{}); err != nil {
		t.Fatal(err)
	}
	if h.shutdown.calls != 1 {
		t.Fatalf("shutdown calls %d", h.shutdown.calls)
	}
}

// The stdio streams' connections are dialed while the guest creates the
// process; when such a dial failed the stream is opened on a new one.
func TestStreamsDialedAheadOrOpenedAfter(t *testing.T) {
	for _, dialErr := range []error{nil, errors.New("vsock dial refused")} {
		h := newHarness(t)
		h.agent.DialStreamErr = dialErr
		f := h.fifos(false)
		h.create("c1", []string{"echo", "hi"}, f, nil)
		h.start("c1", "")
		if got := readAll(t, f.stdout); got != "hi\n" {
			t.Fatalf("dial error %v: stdout %q", dialErr, got)
		}
		if st := h.wait("c1", ""); st != 0 {
			t.Fatalf("dial error %v: exit %d", dialErr, st)
		}
		// stdout and stderr: dialed ahead each, attached once each.
		if d, o := h.agent.CallCount("DialStream"), h.agent.CallCount("OpenStream"); d != 2 || o != 2 {
			t.Fatalf("dial error %v: %d streams dialed ahead, %d opened, want 2 and 2 (calls %v)", dialErr, d, o, h.agent.CallLog())
		}
	}
}

func TestExitCodesAndSignals(t *testing.T) {
	h := newHarness(t)
	h.create("c1", []string{"sleep"}, nil, nil)
	h.start("c1", "")
	for _, tc := range []struct {
		exec string
		args []string
		sig  uint32
		want uint32
	}{
		{"e-exit3", []string{"exit", "3"}, 0, 3},
		{"e-term", []string{"sleep"}, uint32(syscall.SIGTERM), 128 + 15},
		{"e-kill", []string{"sleep"}, uint32(syscall.SIGKILL), 128 + 9},
		{"e-missing", []string{"no-such-binary"}, 0, 127},
	} {
		h.exec("c1", tc.exec, tc.args, nil, false)
		h.start("c1", tc.exec)
		if tc.sig != 0 {
			if _, err := h.svc.Kill(h.ctx, &taskAPI.KillRequest{ID: "c1", ExecID: tc.exec, Signal: tc.sig}); err != nil {
				t.Fatal(err)
			}
		}
		if st := h.wait("c1", tc.exec); st != tc.want {
			t.Errorf("%s: exit %d, want %d", tc.exec, st, tc.want)
		}
		_, err := h.svc.Kill(h.ctx, &taskAPI.KillRequest{ID: "c1", ExecID: tc.exec, Signal: 9})
		wantCode(t, err, codes.NotFound, "already finished")
		h.delete("c1", tc.exec)
	}
	if n := len(h.find(runtime.TaskExecAddedEventTopic)); n != 4 {
		t.Errorf("%d exec-added events", n)
	}
	if n := len(h.find(runtime.TaskExecStartedEventTopic)); n != 4 {
		t.Errorf("%d exec-started events", n)
	}
	_, err := h.svc.Delete(h.ctx, &taskAPI.DeleteRequest{ID: "c1"})
	wantCode(t, err, codes.FailedPrecondition, "running")
	if _, err := h.svc.Kill(h.ctx, &taskAPI.KillRequest{ID: "c1", Signal: uint32(syscall.SIGTERM)}); err != nil {
		t.Fatal(err)
	}
	if st := h.wait("c1", ""); st != 143 {
		t.Fatalf("init exit %d", st)
	}
	h.delete("c1", "")
}

func (h *harness) exec(id, execID string, args []string, f *fifos, terminal bool) {
	h.t.Helper()
	b, _ := json.Marshal(specs.Process{Args: args, Terminal: terminal, Cwd: "/"})
	req := &taskAPI.ExecProcessRequest{ID: id, ExecID: execID, Terminal: terminal,
		Spec: &anypb.Any{TypeUrl: "types.containerd.io/opencontainers/runtime-spec/1/Process", Value: b}}
	if f != nil {
		req.Stdin, req.Stdout = f.inPath, f.outPath
		if !terminal {
			req.Stderr = f.errPath
		}
	}
	if _, err := h.svc.Exec(h.ctx, req); err != nil {
		h.t.Fatalf("exec %s/%s: %v", id, execID, err)
	}
}

func TestKillAllEndsEveryProcess(t *testing.T) {
	h := newHarness(t)
	h.create("c1", []string{"sleep"}, nil, nil)
	h.start("c1", "")
	h.exec("c1", "e1", []string{"sleep"}, nil, false)
	h.start("c1", "e1")
	pids, err := h.svc.Pids(h.ctx, &taskAPI.PidsRequest{ID: "c1"})
	if err != nil || len(pids.Processes) != 2 {
		t.Fatalf("pids %v %v", pids, err)
	}
	if _, err := h.svc.Kill(h.ctx, &taskAPI.KillRequest{ID: "c1", Signal: 9, All: true}); err != nil {
		t.Fatal(err)
	}
	if st := h.wait("c1", "e1"); st != 137 {
		t.Fatalf("exec exit %d", st)
	}
	if st := h.wait("c1", ""); st != 137 {
		t.Fatalf("init exit %d", st)
	}
	exits := h.find(runtime.TaskExitEventTopic)
	if len(exits) != 2 {
		t.Fatalf("%d exit events", len(exits))
	}
	h.delete("c1", "")
}

func TestStdinPipedThroughAndCloseIO(t *testing.T) {
	h := newHarness(t)
	h.create("c1", []string{"sleep"}, nil, nil)
	h.start("c1", "")
	f := h.fifos(true)
	h.exec("c1", "cat", []string{"cat"}, f, false)
	h.start("c1", "cat")
	if _, err := io.WriteString(f.stdin, "piped line\n"); err != nil {
		t.Fatal(err)
	}
	f.stdin.Close()
	if _, err := h.svc.CloseIO(h.ctx, &taskAPI.CloseIORequest{ID: "c1", ExecID: "cat", Stdin: true}); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, f.stdout); got != "piped line\n" {
		t.Fatalf("stdout %q", got)
	}
	if st := h.wait("c1", "cat"); st != 0 {
		t.Fatalf("cat exit %d", st)
	}
	if h.agent.CallCount("CloseStdin") != 1 {
		t.Fatal("agent CloseStdin not called")
	}
}

func TestTerminalResize(t *testing.T) {
	h := newHarness(t)
	h.create("c1", []string{"sleep"}, nil, nil)
	h.start("c1", "")
	f := h.fifos(true)
	h.exec("c1", "tty", []string{"sleep"}, f, true)
	if _, err := h.svc.ResizePty(h.ctx, &taskAPI.ResizePtyRequest{ID: "c1", ExecID: "tty", Width: 120, Height: 40}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(h.agent.Resizes, ";"); got != "c1/tty 120x40" {
		t.Fatalf("resizes %q", got)
	}
	// A terminal carries stdout and stderr in one stream: stderr is not requested.
	if n := h.agent.CallCount("OpenStream"); n != 2 {
		t.Fatalf("%d streams opened for a terminal, want 2", n)
	}
	_, err := h.svc.ResizePty(h.ctx, &taskAPI.ResizePtyRequest{ID: "c1", Width: 1, Height: 1})
	wantCode(t, err, codes.Unknown, "no terminal")
}

func TestPauseResume(t *testing.T) {
	h := newHarness(t)
	h.create("c1", []string{"sleep"}, nil, nil)
	h.start("c1", "")
	if _, err := h.svc.Pause(h.ctx, &taskAPI.PauseRequest{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	if !h.vmm.Paused || h.state("c1", "") != apitask.Status_PAUSED {
		t.Fatal("not paused")
	}
	// The guest's filesystems freeze before the vCPUs stop (a host-side reader of the rootfs image then sees
	// a clean filesystem) and thaw once they run again.
	if !h.agent.Frozen() {
		t.Fatal("paused, but the guest's filesystems were not frozen")
	}
	_, err := h.svc.Kill(h.ctx, &taskAPI.KillRequest{ID: "c1", Signal: 9})
	wantCode(t, err, codes.FailedPrecondition, "paused")
	_, err = h.svc.Pause(h.ctx, &taskAPI.PauseRequest{ID: "c1"})
	wantCode(t, err, codes.FailedPrecondition, "paused")
	if _, err := h.svc.Resume(h.ctx, &taskAPI.ResumeRequest{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	if h.vmm.Paused || h.state("c1", "") != apitask.Status_RUNNING {
		t.Fatal("not resumed")
	}
	if h.agent.Frozen() {
		t.Fatal("resumed, but the guest's filesystems are still frozen")
	}
	_, err = h.svc.Resume(h.ctx, &taskAPI.ResumeRequest{ID: "c1"})
	wantCode(t, err, codes.FailedPrecondition, "running")
	if len(h.find(runtime.TaskPausedEventTopic)) != 1 || len(h.find(runtime.TaskResumedEventTopic)) != 1 {
		t.Fatalf("events %v", h.topics())
	}
}

func TestRejectsNonCubeRootfs(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name   string
		mounts []*types.Mount
		want   string
	}{
		{"overlay", []*types.Mount{{Type: "overlay", Source: "overlay", Options: []string{"lowerdir=/a"}}}, `"overlay" is not supported`},
		{"none", nil, "no rootfs mount"},
		{"ext4-not-loop", []*types.Mount{{Type: "ext4", Source: "/dev/sda1"}}, "not a loop image"},
		{"two", append(rootfs("/a"), rootfs("/b")...), "2 rootfs mounts"},
	} {
		_, err := h.svc.Create(h.ctx, &taskAPI.CreateTaskRequest{ID: "c-" + tc.name, Bundle: h.bundle("c-"+tc.name, []string{"echo"}, false, nil), Rootfs: tc.mounts})
		wantCode(t, err, codes.InvalidArgument, tc.want)
		if !strings.Contains(err.Error(), "--snapshotter cube") {
			t.Errorf("%s: error does not name the cube snapshotter: %v", tc.name, err)
		}
	}
	if h.boots != 0 {
		t.Fatalf("a VM was made for a bad rootfs (%d)", h.boots)
	}
	_, err := h.svc.Create(h.ctx, &taskAPI.CreateTaskRequest{ID: "../x", Bundle: "/", Rootfs: rootfs("/a")})
	wantCode(t, err, codes.InvalidArgument, "not allowed")
}

func TestVMMDyingEndsTasks(t *testing.T) {
	h := newHarness(t)
	f := h.fifos(false)
	h.create("c1", []string{"sleep"}, f, nil)
	h.start("c1", "")
	h.exec("c1", "e1", []string{"sleep"}, nil, false)
	h.start("c1", "e1")
	dir := SandboxDir(h.stateDir, "test", "c1")
	if _, err := os.Stat(filepath.Join(dir, "vsock.sock")); err != nil {
		t.Fatalf("no vsock socket while running: %v", err)
	}
	h.vmm.Crash()
	if st := h.wait("c1", ""); st != 137 {
		t.Fatalf("init exit after vmm death %d, want 137", st)
	}
	if st := h.wait("c1", "e1"); st != 137 {
		t.Fatalf("exec exit after vmm death %d", st)
	}
	if n := len(h.find(runtime.TaskExitEventTopic)); n != 2 {
		t.Fatalf("%d exit events", n)
	}
	// stdout reaches EOF: the client is not left hanging.
	readAll(t, f.stdout)
	if h.state("c1", "") != apitask.Status_STOPPED {
		t.Fatal("not stopped")
	}
	// Sockets and stub disks went with the VM.
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("sandbox dir left: %v", err)
	}
	_, err := h.svc.Exec(h.ctx, &taskAPI.ExecProcessRequest{ID: "c1", ExecID: "late", Spec: &anypb.Any{Value: []byte(`{"args":["sleep"]}`)}})
	wantCode(t, err, codes.FailedPrecondition, "stopped")
	d := h.delete("c1", "")
	if d.ExitStatus != 137 {
		t.Fatalf("delete exit %d", d.ExitStatus)
	}
	ev := h.find(runtime.TaskDeleteEventTopic)
	if len(ev) != 1 || ev[0].(*eventstypes.TaskDelete).ExitStatus != 137 {
		t.Fatalf("delete events %v", ev)
	}
}

func TestPodSharesOneVM(t *testing.T) {
	h := newHarness(t)
	pod := map[string]string{SandboxIDAnnotation: "pod1"}
	h.create("pod1", []string{"sleep"}, nil, pod)
	h.start("pod1", "")
	h.create("app1", []string{"sleep"}, nil, pod)
	h.start("app1", "")
	if h.boots != 1 {
		t.Fatalf("%d VMs for one pod", h.boots)
	}
	if got := h.vmm.Disks["cube-slot-1"]; got != "/images/app1.ext4" {
		t.Fatalf("slot 1 = %q, want app1's image", got)
	}
	if got := len(h.agent.Mounts()); got != 2 {
		t.Fatalf("%d guest mounts", got)
	}
	for _, id := range []string{"pod1", "app1"} {
		h.exec(id, "x-"+id, []string{"exit", "0"}, nil, false)
		h.start(id, "x-"+id)
		if st := h.wait(id, "x-"+id); st != 0 {
			t.Fatalf("exec in %s: %d", id, st)
		}
	}
	_, err := h.svc.Pause(h.ctx, &taskAPI.PauseRequest{ID: "app1"})
	wantCode(t, err, codes.FailedPrecondition, "whole VM")
	// A container of another pod does not belong in this shim.
	_, err = h.svc.Create(h.ctx, &taskAPI.CreateTaskRequest{ID: "other", Bundle: h.bundle("other", []string{"sleep"}, false, map[string]string{SandboxIDAnnotation: "pod2"}), Rootfs: rootfs("/images/o.ext4")})
	wantCode(t, err, codes.InvalidArgument, "pod2")

	h.svc.Kill(h.ctx, &taskAPI.KillRequest{ID: "app1", Signal: 9})
	h.wait("app1", "")
	h.delete("app1", "")
	// app1's slot points at its stub again; the VM keeps running for the pod.
	if got := h.vmm.Disks["cube-slot-1"]; !strings.HasSuffix(got, "slot-1.img") {
		t.Fatalf("slot 1 after delete = %q", got)
	}
	select {
	case <-h.vmm.Wait():
		t.Fatal("vm stopped while the pod still has a container")
	default:
	}
	if _, err := h.svc.Shutdown(h.ctx, &taskAPI.ShutdownRequest{}); err != nil || h.shutdown.calls != 0 {
		t.Fatalf("shutdown with a live container: %v, %d calls", err, h.shutdown.calls)
	}
	h.svc.Kill(h.ctx, &taskAPI.KillRequest{ID: "pod1", Signal: 9})
	h.wait("pod1", "")
	h.delete("pod1", "")
	<-h.vmm.Wait()
}

func TestDiskSlotsExhausted(t *testing.T) {
	h := newHarness(t)
	pod := map[string]string{SandboxIDAnnotation: "pod1"}
	h.create("pod1", []string{"sleep"}, nil, pod)
	h.create("a1", []string{"sleep"}, nil, pod)
	h.create("a2", []string{"sleep"}, nil, pod)
	_, err := h.svc.Create(h.ctx, &taskAPI.CreateTaskRequest{ID: "a3", Bundle: h.bundle("a3", []string{"sleep"}, false, pod), Rootfs: rootfs("/images/a3.ext4")})
	wantCode(t, err, codes.ResourceExhausted, "disk slots are in use")
	// The failed create left nothing behind: the id can be used again later.
	h.delete("a2", "")
	h.create("a3", []string{"sleep"}, nil, pod)
}

func TestUnimplementedRPCsSayWhy(t *testing.T) {
	h := newHarness(t)
	h.create("c1", []string{"sleep"}, nil, nil)
	_, err := h.svc.Update(h.ctx, &taskAPI.UpdateTaskRequest{ID: "c1"})
	wantCode(t, err, codes.Unimplemented, "resizing a sandbox VM")
	_, err = h.svc.Stats(h.ctx, &taskAPI.StatsRequest{ID: "c1"})
	wantCode(t, err, codes.Unimplemented, "not placed in a cgroup")
	_, err = h.svc.State(h.ctx, &taskAPI.StateRequest{ID: "nope"})
	wantCode(t, err, codes.NotFound, "nope")
	c, err := h.svc.Connect(h.ctx, &taskAPI.ConnectRequest{ID: "c1"})
	if err != nil || c.ShimPid != uint32(os.Getpid()) || c.TaskPid == 0 {
		t.Fatalf("connect %+v %v", c, err)
	}
}

func TestDeleteCreatedKillsIt(t *testing.T) {
	h := newHarness(t)
	h.create("c1", []string{"sleep"}, nil, nil)
	h.delete("c1", "")
	if ids := h.agent.Containers(); len(ids) != 0 {
		t.Fatalf("agent still holds %v", ids)
	}
	<-h.vmm.Wait()
}

func TestBootFailureCleansUp(t *testing.T) {
	h := newHarness(t)
	h.vmm.StartErr = fmt.Errorf("no /dev/kvm")
	_, err := h.svc.Create(h.ctx, &taskAPI.CreateTaskRequest{ID: "c1", Bundle: h.bundle("c1", []string{"sleep"}, false, nil), Rootfs: rootfs("/i.ext4")})
	wantCode(t, err, codes.Unknown, "no /dev/kvm")
	if _, err := os.Stat(SandboxDir(h.stateDir, "test", "c1")); !os.IsNotExist(err) {
		t.Fatalf("sandbox dir left after failed boot: %v", err)
	}
	if _, err := h.svc.State(h.ctx, &taskAPI.StateRequest{ID: "c1"}); status.Code(err) != codes.NotFound {
		t.Fatalf("failed create left a container: %v", err)
	}
}

// TestStatsReportsTheVMMCgroup needs root: it makes a real cgroup holding a
// stand-in VMM process (sleep) and reads its metrics through Stats.
func TestStatsReportsTheVMMCgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("creating a cgroup needs root")
	}
	h := newHarness(t)
	vmm := exec.Command("sleep", "60")
	if err := vmm.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { vmm.Process.Kill(); vmm.Wait() }()
	h.cgroup = fmt.Sprintf("/cube-shim-stats-%d", os.Getpid())
	if err := sandbox.PlaceInCgroup(h.cgroup, vmm.Process.Pid); err != nil {
		t.Fatal(err)
	}
	h.create("c1", []string{"sleep"}, nil, nil)
	r, err := h.svc.Stats(h.ctx, &taskAPI.StatsRequest{ID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := typeurl.UnmarshalAny(r.Stats)
	if err != nil {
		t.Fatal(err)
	}
	var current uint64
	switch v := m.(type) {
	case *cgroupsv1stats.Metrics:
		current = v.GetPids().GetCurrent()
	case *cgroupsv2stats.Metrics:
		current = v.GetPids().GetCurrent()
	default:
		t.Fatalf("stats type %T", m)
	}
	if current != 1 {
		t.Fatalf("pids in the VMM cgroup = %d, want 1", current)
	}
	vmm.Process.Kill()
	vmm.Wait()
	h.delete("c1", "")
	// The sandbox removed the VMM's cgroup with the VM.
	if _, err := sandbox.CgroupMetrics(h.cgroup); err == nil {
		sandbox.RemoveCgroup(h.cgroup)
		t.Fatal("cgroup still there after the sandbox stopped")
	}
}

func TestTemplateRestore(t *testing.T) {
	h := newHarness(t)
	load := h.svc.o.LoadConfig
	h.svc.o.LoadConfig = func(p string) (config.Config, error) {
		c, err := load(p)
		c.Template = "/var/lib/cube/templates/base"
		return c, err
	}
	h.svc.o.NewSandbox = func(ctx context.Context, id string, cfg config.Config, spec *specs.Spec, bundle string) (*sandbox.Sandbox, error) {
		return sandbox.New(sandbox.Options{ID: id, Dir: SandboxDir(cfg.StateDir, "test", id), DiskSlots: int(cfg.DiskSlots),
			Template: cfg.Template, BootTimeout: time.Second, VMM: h.vmm, Dial: sandboxtest.Dialer(h.agent)})
	}
	f := h.fifos(false)
	h.create("c1", []string{"echo", "restored"}, f, nil)
	if got := h.vmm.Config.Template; got != "/var/lib/cube/templates/base" {
		t.Fatalf("vmm restore dir %q", got)
	}
	// Restored on the sandbox's own stubs, the rootfs set in slot 0 before
	// the guest ran: no disk-set op after the restore.
	if got := h.vmm.Config.DiskUses["cube-slot-0"]; !strings.HasSuffix(got, "slot-0.img") {
		t.Fatalf("slot 0 restored on %q, want its stub", got)
	}
	if got := h.vmm.Config.DiskSets["cube-slot-0"]; got != "/images/c1.ext4" {
		t.Fatalf("slot 0 set to %q before the guest ran", got)
	}
	if got, n := h.vmm.Disks["cube-slot-0"], h.vmm.SetDiskCount(); got != "/images/c1.ext4" || n != 0 {
		t.Fatalf("slot 0 after create = %q, %d disk-set ops", got, n)
	}
	// Clock and RNG were refreshed and the rootfs mounted before the
	// container was created, in one call (Freshen), first (a restored
	// agent gets no Health: the vsock handshake shows it listens).
	// (The streams' connections are dialed concurrently with the create.)
	calls := slices.DeleteFunc(h.agent.CallLog(), func(c string) bool { return c == "DialStream" })
	if len(calls) < 2 || calls[0] != "Freshen" || calls[1] != "CreateContainer" || h.agent.CallCount("MountDisk") != 0 {
		t.Fatalf("agent calls %v: want Freshen, then CreateContainer", calls)
	}
	h.start("c1", "")
	if got := readAll(t, f.stdout); got != "restored\n" {
		t.Fatalf("stdout %q", got)
	}
	h.wait("c1", "")
	h.delete("c1", "")
}

func TestSpecWithRootPointsAtTheGuestMount(t *testing.T) {
	in := []byte(`{"ociVersion":"1.2.0","root":{"path":"rootfs","readonly":true},"x-unknown":{"keep":1},"process":{"args":["sh"]}}`)
	out, err := specWithRoot(in, "/run/cube/disks/cube-slot-0")
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	json.Unmarshal(out, &got)
	root := got["root"].(map[string]any)
	if root["path"] != "/run/cube/disks/cube-slot-0" || root["readonly"] != true || got["x-unknown"] == nil || got["process"] == nil {
		t.Fatalf("spec %s", out)
	}
	if _, err := specWithRoot([]byte(`[`), "/x"); err == nil {
		t.Fatal("bad json: want error")
	}
}

// Exit events come from no RPC: they must still carry the namespace
// (containerd refuses events without one).
func TestEventsCarryTheNamespace(t *testing.T) {
	h := newHarness(t)
	nsr := &nsRecorder{}
	h.svc.o.Publisher = nsr
	h.create("c1", []string{"exit", "0"}, nil, nil)
	h.start("c1", "")
	h.wait("c1", "")
	h.flushEvents()
	nsr.mu.Lock()
	defer nsr.mu.Unlock()
	if len(nsr.namespaces) < 3 {
		t.Fatalf("events %v", nsr.namespaces)
	}
	for _, ns := range nsr.namespaces {
		if ns != "test" {
			t.Fatalf("event namespaces %v", nsr.namespaces)
		}
	}
}

type nsRecorder struct {
	mu         sync.Mutex
	namespaces []string
}

func (r *nsRecorder) Publish(ctx context.Context, topic string, ev events.Event) error {
	ns, _ := namespaces.Namespace(ctx)
	r.mu.Lock()
	r.namespaces = append(r.namespaces, ns)
	r.mu.Unlock()
	return nil
}

func TestCheckpoint(t *testing.T) {
	h := newHarness(t)
	h.create("c1", []string{"sleep"}, nil, nil)
	// Not started yet: nothing to snapshot.
	_, err := h.svc.Checkpoint(h.ctx, &taskAPI.CheckpointTaskRequest{ID: "c1", Path: t.TempDir()})
	wantCode(t, err, codes.FailedPrecondition, "created")
	h.start("c1", "")
	_, err = h.svc.Checkpoint(h.ctx, &taskAPI.CheckpointTaskRequest{ID: "c1", Path: "rel/dir"})
	wantCode(t, err, codes.InvalidArgument, "absolute")
	wrong, _ := typeurl.MarshalAnyToProto(&options.Options{})
	_, err = h.svc.Checkpoint(h.ctx, &taskAPI.CheckpointTaskRequest{ID: "c1", Path: t.TempDir(), Options: wrong})
	wantCode(t, err, codes.InvalidArgument, "CheckpointOptions")
	_, err = h.svc.Checkpoint(h.ctx, &taskAPI.CheckpointTaskRequest{ID: "nope", Path: t.TempDir()})
	wantCode(t, err, codes.NotFound, "nope")

	// As containerd's client does it: paused around the call; the VM stays paused.
	if _, err := h.svc.Pause(h.ctx, &taskAPI.PauseRequest{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ckpt") // created when missing
	opts, _ := typeurl.MarshalAnyToProto(&options.CheckpointOptions{ImagePath: path})
	if _, err := h.svc.Checkpoint(h.ctx, &taskAPI.CheckpointTaskRequest{ID: "c1", Path: path, Options: opts}); err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(path, CheckpointDirName); len(h.vmm.Snapshots) != 1 || h.vmm.Snapshots[0] != want {
		t.Fatalf("snapshots %v, want [%s]", h.vmm.Snapshots, want)
	}
	if !h.vmm.Paused || h.state("c1", "") != apitask.Status_PAUSED {
		t.Fatal("checkpoint of a paused task did not leave it paused")
	}
	ev := h.find(runtime.TaskCheckpointedEventTopic)
	if len(ev) != 1 || ev[0].(*eventstypes.TaskCheckpointed).Checkpoint != filepath.Join(path, CheckpointDirName) {
		t.Fatalf("checkpointed events %v", ev)
	}
	// The same path twice would overwrite: refused, the first one kept.
	_, err = h.svc.Checkpoint(h.ctx, &taskAPI.CheckpointTaskRequest{ID: "c1", Path: path})
	wantCode(t, err, codes.AlreadyExists, "already holds a checkpoint")
	if _, err := h.svc.Resume(h.ctx, &taskAPI.ResumeRequest{ID: "c1"}); err != nil {
		t.Fatal(err)
	}

	// A VMM that fails: the error comes back, the task keeps running.
	h.vmm.SnapshotErr = errors.New("disk full")
	_, err = h.svc.Checkpoint(h.ctx, &taskAPI.CheckpointTaskRequest{ID: "c1", Path: t.TempDir()})
	wantCode(t, err, codes.Unknown, "disk full")
	if h.state("c1", "") != apitask.Status_RUNNING {
		t.Fatal("a failed checkpoint stopped the task")
	}
	h.vmm.SnapshotErr = nil

	// --exit: snapshot, then the container ends as killed and the VM is gone.
	exit, _ := typeurl.MarshalAnyToProto(&options.CheckpointOptions{Exit: true})
	if _, err := h.svc.Checkpoint(h.ctx, &taskAPI.CheckpointTaskRequest{ID: "c1", Path: t.TempDir(), Options: exit}); err != nil {
		t.Fatal(err)
	}
	if st := h.wait("c1", ""); st != 137 {
		t.Fatalf("exit status after checkpoint --exit: %d, want 137", st)
	}
	if d := h.delete("c1", ""); d.ExitStatus != 137 {
		t.Fatalf("delete exit %d", d.ExitStatus)
	}
	if _, err := os.Stat(SandboxDir(h.stateDir, "test", "c1")); !os.IsNotExist(err) {
		t.Fatalf("sandbox dir left after checkpoint --exit: %v", err)
	}
}

// gatedPublisher is containerd's event endpoint that can stop taking events:
// while closed, Publish blocks (containerd restarting, or slow to answer:
// pkg/shim's publisher then redials and retries for seconds per event).
type gatedPublisher struct {
	rec  *recorder
	mu   sync.Mutex
	gate chan struct{} // closed while events are taken
}

func newGatedPublisher(rec *recorder) *gatedPublisher {
	g := &gatedPublisher{rec: rec, gate: make(chan struct{})}
	close(g.gate)
	return g
}

func (g *gatedPublisher) Publish(ctx context.Context, topic string, ev events.Event) error {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	<-gate
	return g.rec.Publish(ctx, topic, ev)
}

func (g *gatedPublisher) close() {
	g.mu.Lock()
	g.gate = make(chan struct{})
	g.mu.Unlock()
}

func (g *gatedPublisher) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.gate:
	default:
		close(g.gate)
	}
}

// An exec (Exec, Start, Wait) while containerd takes no events — as after a
// restart of containerd, when `ctr task exec` once never returned — returns
// its exit status at once; the events follow, in order, once containerd takes
// them again.
func TestExecDoesNotWaitForContainerdToTakeEvents(t *testing.T) {
	h := newHarness(t)
	pub := newGatedPublisher(h.events)
	h.svc.o.Publisher = pub
	t.Cleanup(pub.open) // lets a blocked RPC of a failed run return
	h.create("c1", []string{"sleep"}, nil, nil)
	h.start("c1", "")

	pub.close()
	type result struct {
		status uint32
		err    error
	}
	done := make(chan result, 1)
	go func() {
		b, _ := json.Marshal(specs.Process{Args: []string{"exit", "2"}, Cwd: "/"})
		if _, err := h.svc.Exec(h.ctx, &taskAPI.ExecProcessRequest{ID: "c1", ExecID: "after",
			Spec: &anypb.Any{TypeUrl: "types.containerd.io/opencontainers/runtime-spec/1/Process", Value: b}}); err != nil {
			done <- result{err: fmt.Errorf("exec: %w", err)}
			return
		}
		if _, err := h.svc.Start(h.ctx, &taskAPI.StartRequest{ID: "c1", ExecID: "after"}); err != nil {
			done <- result{err: fmt.Errorf("start: %w", err)}
			return
		}
		r, err := h.svc.Wait(h.ctx, &taskAPI.WaitRequest{ID: "c1", ExecID: "after"})
		if err != nil {
			done <- result{err: fmt.Errorf("wait: %w", err)}
			return
		}
		done <- result{status: r.ExitStatus}
	}()
	select {
	case r := <-done:
		if r.err != nil || r.status != 2 {
			t.Fatalf("exec while containerd takes no events: status %d, %v; want 2", r.status, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("Exec/Start/Wait of an exec still blocked after 5s while containerd takes no events: an RPC waits for the event publisher (events so far: %v)", h.events.topics())
	}
	if got := h.state("c1", "after"); got != apitask.Status_STOPPED {
		t.Fatalf("exec state %v, want STOPPED", got)
	}
	h.delete("c1", "after")

	pub.open()
	want := strings.Join([]string{runtime.TaskCreateEventTopic, runtime.TaskStartEventTopic,
		runtime.TaskExecAddedEventTopic, runtime.TaskExecStartedEventTopic, runtime.TaskExitEventTopic}, ",")
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := strings.Join(h.events.topics(), ",")
		if got == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events once containerd takes them again: %s, want %s", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	exits := h.events.find(runtime.TaskExitEventTopic)
	if e := exits[0].(*eventstypes.TaskExit); e.ID != "after" || e.ExitStatus != 2 {
		t.Fatalf("exit event %+v, want exec after with status 2", e)
	}
}

// callbackShutdown runs the registered shutdown callbacks on Shutdown, as
// pkg/shim's shutdown service does before the shim exits.
type callbackShutdown struct {
	shutdownRecorder
	cbs []func(context.Context) error
}

func (s *callbackShutdown) RegisterCallback(fn func(context.Context) error) {
	s.cbs = append(s.cbs, fn)
}

// Events queued while containerd is slow to take them are all handed over,
// in order, before the shim exits: the shutdown waits for the queue.
func TestShutdownDeliversQueuedEvents(t *testing.T) {
	rec := &recorder{}
	slow := publisherFunc(func(ctx context.Context, topic string, ev events.Event) error {
		time.Sleep(50 * time.Millisecond) // each event takes containerd a while
		return rec.Publish(ctx, topic, ev)
	})
	sd := &callbackShutdown{}
	svc := New(Options{Namespace: "test", Publisher: slow, Shutdown: sd})
	if len(sd.cbs) != 1 {
		t.Fatalf("%d shutdown callbacks registered, want 1 (flushing the events)", len(sd.cbs))
	}
	ctx := context.Background()
	var want []string
	for i := range 5 {
		topic := fmt.Sprintf("/test/%d", i)
		svc.publish(ctx, topic, &eventstypes.TaskOOM{ContainerID: "c1"})
		want = append(want, topic)
	}
	if got := rec.topics(); len(got) == len(want) {
		t.Fatalf("all %d events published before publish returned: publishing is not asynchronous", len(got))
	}
	if err := sd.cbs[0](ctx); err != nil {
		t.Fatal(err)
	}
	if got := rec.topics(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("events after the shutdown callback %v, want %v in order", got, want)
	}
}

type publisherFunc func(ctx context.Context, topic string, ev events.Event) error

func (f publisherFunc) Publish(ctx context.Context, topic string, ev events.Event) error {
	return f(ctx, topic, ev)
}

// The sandbox's last container, its init exited: the VM is synced and
// stopped first and the guest-side delete skipped (the power-off takes the
// process with it); any other container is deleted in the guest.
func TestDeleteLastExitedContainerStopsTheVMFirst(t *testing.T) {
	h := newHarness(t)
	pod := map[string]string{SandboxIDAnnotation: "pod1"}
	h.create("pod1", []string{"sleep"}, nil, pod)
	h.start("pod1", "")
	h.create("app1", []string{"exit", "3"}, nil, pod)
	h.start("app1", "")
	if st := h.wait("app1", ""); st != 3 {
		t.Fatalf("app1 exit %d", st)
	}
	if r := h.delete("app1", ""); r.ExitStatus != 3 {
		t.Fatalf("delete app1: exit %d", r.ExitStatus)
	}
	if n := h.agent.CallCount("Delete"); n != 1 {
		t.Fatalf("deleting a container that is not the last: %d guest deletes, want 1 (calls %v)", n, h.agent.CallLog())
	}
	select {
	case <-h.vmm.Wait():
		t.Fatal("VM stopped with a container left")
	default:
	}
	h.svc.Kill(h.ctx, &taskAPI.KillRequest{ID: "pod1", Signal: 9})
	h.wait("pod1", "")
	if r := h.delete("pod1", ""); r.ExitStatus != 137 {
		t.Fatalf("delete pod1: exit %d, want 137", r.ExitStatus)
	}
	calls := h.agent.CallLog()
	if n := h.agent.CallCount("Delete"); n != 1 {
		t.Fatalf("the last container: %d guest deletes, want none beyond app1's (calls %v)", n, calls)
	}
	if h.agent.CallCount("SyncFilesystems") != 1 {
		t.Fatalf("the VM stopped without a sync (calls %v)", calls)
	}
	<-h.vmm.Wait()
	if _, err := h.svc.State(h.ctx, &taskAPI.StateRequest{ID: "pod1"}); status.Code(err) != codes.NotFound {
		t.Fatalf("pod1 still known after delete: %v", err)
	}
}
