package cube

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/checkpoint/api"
	"github.com/cube-runtime/cube/checkpoint/snapshots"
	"github.com/cube-runtime/cube/checkpoint/store"
	"github.com/cube-runtime/cube/checkpoint/store/storetest"
	snapapi "github.com/cube-runtime/cube/shim/snapshotapi"
)

// The SDK is tested against the real cube-api handlers (httptest) over a
// small in-memory containerd (backend) and a real snapshot store.

type backend struct {
	mu   sync.Mutex
	ctrs map[string]*api.Container
	st   *store.Store
	pid  uint32
	busy atomic.Bool // Rollback answers "busy"
	// network is the last create's network; policy the last one set.
	network, policy *api.NetworkPolicy
	// made counts sandboxes made from snapshots; the failAt'th fails.
	made, failAt int
	*api.DirFiles
}

func (b *backend) CheckImage(ctx context.Context, ref string) error {
	if ref != "busybox" {
		return errdefs.ErrNotFound
	}
	return nil
}

func (b *backend) Create(ctx context.Context, s api.CreateSpec) (api.Container, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := &api.Container{ID: s.ID, Image: s.Image, Labels: s.Labels, Status: "running", Created: time.Now()}
	b.ctrs[s.ID] = c
	b.network = s.Network
	return *c, nil
}

func (b *backend) List(ctx context.Context) ([]api.Container, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []api.Container
	for _, c := range b.ctrs {
		out = append(out, *c)
	}
	return out, nil
}

func (b *backend) get(id string) (*api.Container, error) {
	if c := b.ctrs[id]; c != nil {
		return c, nil
	}
	return nil, fmt.Errorf("no sandbox %s: %w", id, errdefs.ErrNotFound)
}

func (b *backend) Get(ctx context.Context, id string) (api.Container, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c, err := b.get(id)
	if err != nil {
		return api.Container{}, err
	}
	cp := *c
	return cp, nil
}

func (b *backend) Delete(ctx context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, err := b.get(id); err != nil {
		return err
	}
	delete(b.ctrs, id)
	return nil
}

func (b *backend) status(id, to string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	c, err := b.get(id)
	if err == nil {
		c.Status = to
	}
	return err
}

func (b *backend) Pause(ctx context.Context, id string) error  { return b.status(id, "paused") }
func (b *backend) Resume(ctx context.Context, id string) error { return b.status(id, "running") }

func (b *backend) SetLabels(ctx context.Context, id string, l map[string]string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	c, err := b.get(id)
	if err != nil {
		return err
	}
	nl := map[string]string{}
	for k, v := range c.Labels {
		nl[k] = v
	}
	for k, v := range l {
		nl[k] = v
	}
	c.Labels = nl
	return nil
}

type shim struct{}

func (shim) Snapshot(ctx context.Context, req *snapapi.SnapshotRequest) (*snapapi.SnapshotResponse, error) {
	return &snapapi.SnapshotResponse{}, storetest.Write(req.Dir, "")
}

func (shim) List(ctx context.Context, req *snapapi.ListRequest) (*snapapi.ListResponse, error) {
	return &snapapi.ListResponse{}, nil
}

func (shim) Rollback(ctx context.Context, req *snapapi.RollbackRequest) (*snapapi.RollbackResponse, error) {
	return &snapapi.RollbackResponse{Id: req.Id, Memory: "remap", Timings: &snapapi.RollbackTimings{ShimTotalMs: 3}}, nil
}

func (b *backend) Rollback(ctx context.Context, id, ref string) (snapshots.RolledBack, error) {
	if _, err := b.Get(ctx, id); err != nil {
		return snapshots.RolledBack{}, err
	}
	if b.busy.Load() {
		return snapshots.RolledBack{}, fmt.Errorf("sandbox %s is busy: %w", id, errdefs.ErrConflict)
	}
	return snapshots.Rollback(ctx, b.st, rollbackShim{}, snapshots.RollbackOptions{Container: id, Sandbox: snapshots.SandboxKey(api.DefaultNamespace, id), Ref: ref})
}

// rollbackShim reports this process as the VMM (the store checks the pid).
type rollbackShim struct{ shim }

func (rollbackShim) List(ctx context.Context, req *snapapi.ListRequest) (*snapapi.ListResponse, error) {
	return &snapapi.ListResponse{VmmPid: uint32(os.Getpid())}, nil
}

func (b *backend) GuestProcesses(ctx context.Context, id string) ([]api.GuestProcess, error) {
	return nil, fmt.Errorf("no guest: %w", errdefs.ErrNotImplemented)
}

func (b *backend) SignalGuest(ctx context.Context, id, execID string, sig syscall.Signal) error {
	return fmt.Errorf("no guest: %w", errdefs.ErrNotImplemented)
}

func (b *backend) Snapshot(ctx context.Context, id string, names []string) (snapshots.Taken, error) {
	return snapshots.Take(ctx, b.st, shim{}, snapshots.Options{Container: id, Sandbox: snapshots.SandboxKey(api.DefaultNamespace, id), Names: names})
}

type proc struct {
	pid  uint32
	done chan struct{}
	kill chan syscall.Signal
	code int
}

func (p *proc) Pid() uint32                          { return p.pid }
func (p *proc) ExecID() string                       { return fmt.Sprintf("%s%d", api.ExecIDPrefix, p.pid) }
func (p *proc) CloseStdin(ctx context.Context) error { return nil }
func (p *proc) Wait(ctx context.Context) (int, error) {
	<-p.done
	return p.code, nil
}

func (p *proc) Kill(ctx context.Context, sig syscall.Signal) error {
	select {
	case p.kill <- sig:
	case <-p.done:
	}
	return nil
}

// Exec runs "/bin/sh -c LINE": LINE "cat" copies stdin, "sleep" waits for a
// signal, "exit N" exits N after "bye" on stderr, else LINE is echoed.
func (b *backend) Exec(ctx context.Context, id string, s api.ExecSpec, eio api.ExecIO) (api.Process, error) {
	b.mu.Lock()
	b.pid++
	p := &proc{pid: b.pid, done: make(chan struct{}), kill: make(chan syscall.Signal)}
	b.mu.Unlock()
	line := strings.Join(append([]string{s.Cmd}, s.Args...), " ")
	line = strings.TrimPrefix(line, "/bin/sh -c ")
	go func() {
		defer close(p.done)
		switch {
		case line == "cat":
			io.Copy(eio.Stdout, eio.Stdin)
		case line == "sleep":
			p.code = 128 + int(<-p.kill)
		case strings.HasPrefix(line, "exit "):
			fmt.Fprint(eio.Stderr, "bye\n")
			fmt.Sscan(strings.TrimPrefix(line, "exit "), &p.code)
		default:
			fmt.Fprintf(eio.Stdout, "%s %s\n", line, strings.Join(s.Env, " "))
		}
	}()
	return p, nil
}

const key = "sdk-test-key-0123456789"

func newClient(t *testing.T) (*Client, *backend) {
	t.Helper()
	st, err := store.Open(context.Background(), t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{ctrs: map[string]*api.Container{}, st: st, DirFiles: &api.DirFiles{Root: t.TempDir()}}
	log := logrus.New()
	log.SetOutput(io.Discard)
	s, err := api.New(api.DefaultConfig(), []string{key}, b, st, api.Options{Log: log})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { s.Stop(); srv.Close() })
	t.Setenv(EnvAPIURL, srv.URL+"/")
	t.Setenv(EnvAPIKey, key)
	t.Setenv(EnvTemplateID, "busybox")
	return NewClient(), b
}

func TestSandboxLifecycle(t *testing.T) {
	c, _ := newClient(t)
	ctx := context.Background()
	if err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	sb, err := c.Create(ctx, CreateOptions{Timeout: 60, Metadata: map[string]string{"k": "v"}, Envs: map[string]string{"E": "1"}})
	if err != nil || sb.Info.State != "running" || sb.Info.TemplateID != "busybox" || sb.Info.Metadata["k"] != "v" {
		t.Fatalf("create: %+v %v", sb, err)
	}
	other, _ := c.Create(ctx, CreateOptions{Metadata: map[string]string{"k": "w"}})
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Pause(ctx); !IsConflict(err) {
		t.Errorf("second pause: %v", err)
	}
	if l, _, err := c.List(ctx, ListOptions{State: []string{"paused"}}); err != nil || len(l) != 1 || l[0].SandboxID != sb.ID {
		t.Errorf("list paused: %+v %v", l, err)
	}
	if err := sb.Resume(ctx, 30); err != nil || sb.Info.State != "running" || sb.Info.Timeout != 30 {
		t.Errorf("resume: %+v %v", sb.Info, err)
	}
	if err := sb.SetTimeout(ctx, 120); err != nil {
		t.Fatal(err)
	}
	if info, err := sb.Refresh(ctx); err != nil || info.Timeout != 120 {
		t.Errorf("after set_timeout: %+v %v", info, err)
	}
	again, err := c.Connect(ctx, sb.ID, 0)
	if err != nil || again.ID != sb.ID {
		t.Errorf("connect: %v", err)
	}
	l, next, err := c.List(ctx, ListOptions{Metadata: map[string]string{"k": "w"}})
	if err != nil || len(l) != 1 || l[0].SandboxID != other.ID || next != "" {
		t.Errorf("list by metadata: %+v %q %v", l, next, err)
	}
	if l, next, err = c.List(ctx, ListOptions{Limit: 1}); err != nil || len(l) != 1 || next == "" {
		t.Errorf("page 1: %+v %q %v", l, next, err)
	}
	if l, next, err = c.List(ctx, ListOptions{Limit: 1, NextToken: next}); err != nil || len(l) != 1 || next != "" {
		t.Errorf("page 2: %+v %q %v", l, next, err)
	}
	if err := sb.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Connect(ctx, sb.ID, 0); !IsNotFound(err) {
		t.Errorf("connect to a killed one: %v", err)
	}
	_, err = c.Create(ctx, CreateOptions{Template: "nope"})
	if e, ok := err.(*APIError); !ok || e.Status != 404 || e.Code != 404 || !strings.Contains(e.Message, "unknown template") || e.RequestID == "" {
		t.Errorf("unknown template: %#v", err)
	}
	bad := &Client{URL: c.URL, APIKey: "wrong-wrong-wrong-wrong"}
	if _, _, err := bad.List(ctx, ListOptions{}); statusOf(err) != 401 {
		t.Errorf("wrong key: %v", err)
	}
}

func TestCommands(t *testing.T) {
	c, _ := newClient(t)
	ctx := context.Background()
	sb, err := c.Create(ctx, CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var streamed []string
	res, err := sb.Commands.Run(ctx, "echo hi", RunOptions{Envs: map[string]string{"A": "b"}, OnStdout: func(s string) { streamed = append(streamed, s) }})
	if err != nil || res.ExitCode != 0 || res.Stdout != "echo hi A=b\n" || strings.Join(streamed, "") != res.Stdout {
		t.Fatalf("run: %+v %v %q", res, err, streamed)
	}
	res, err = sb.Commands.Run(ctx, "exit 4", RunOptions{})
	if r, ok := IsExitError(err); !ok || r.ExitCode != 4 || r.Stderr != "bye\n" || res.ExitCode != 4 {
		t.Errorf("exit 4: %+v %v", res, err)
	}
	if res, err = sb.Commands.Run(ctx, "prog", RunOptions{Args: []string{"a"}}); err != nil || res.Stdout != "prog a \n" {
		t.Errorf("args: %+v %v", res, err)
	}
	// Background: stdin, list, kill.
	cat, err := sb.Commands.Start(ctx, "cat", RunOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := cat.SendStdin(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
	if err := cat.CloseStdin(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := cat.Wait(); err != nil || res.Stdout != "abc" {
		t.Errorf("cat: %+v %v", res, err)
	}
	sl, err := sb.Commands.Start(ctx, "sleep", RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := sb.Commands.List(ctx); err != nil || len(l) != 1 || l[0].Pid != sl.Pid {
		t.Errorf("list: %+v %v", l, err)
	}
	if err := sl.Kill(ctx, "SIGTERM"); err != nil {
		t.Fatal(err)
	}
	if r, ok := IsExitError(func() error { _, err := sl.Wait(); return err }()); !ok || r.ExitCode != 128+15 {
		t.Errorf("killed sleep: %+v", r)
	}
}

func TestSnapshots(t *testing.T) {
	c, _ := newClient(t)
	ctx := context.Background()
	sb, _ := c.Create(ctx, CreateOptions{})
	s1, err := sb.CreateSnapshot(ctx, "one")
	if err != nil || s1.SandboxID != sb.ID || len(s1.Names) != 1 {
		t.Fatalf("snapshot: %+v %v", s1, err)
	}
	if _, err := sb.CreateSnapshot(ctx, "one"); !IsConflict(err) {
		t.Errorf("taken name: %v", err)
	}
	s2, _ := sb.CreateSnapshot(ctx, "")
	l, next, err := sb.ListSnapshots(ctx, 1, "")
	if err != nil || len(l) != 1 || l[0].SnapshotID != s1.SnapshotID || next == "" {
		t.Fatalf("page 1: %+v %q %v", l, next, err)
	}
	if l, next, err = c.ListSnapshots(ctx, ListSnapshotsOptions{SandboxID: sb.ID, Limit: 1, NextToken: next}); err != nil || len(l) != 1 || l[0].SnapshotID != s2.SnapshotID || next != "" {
		t.Errorf("page 2: %+v %q %v", l, next, err)
	}
	if g, err := c.GetSnapshot(ctx, "one"); err != nil || g.SnapshotID != s1.SnapshotID {
		t.Errorf("get: %+v %v", g, err)
	}
	if err := c.DeleteSnapshot(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetSnapshot(ctx, "one"); !IsNotFound(err) {
		t.Errorf("deleted: %v", err)
	}
}

func TestRollback(t *testing.T) {
	c, b := newClient(t)
	ctx := context.Background()
	sb, _ := c.Create(ctx, CreateOptions{})
	s1, err := sb.CreateSnapshot(ctx, "one")
	if err != nil {
		t.Fatal(err)
	}
	rb, err := sb.Rollback(ctx, "one")
	if err != nil || rb.SandboxID != sb.ID || rb.SnapshotID != s1.SnapshotID || rb.Memory != "remap" || rb.TotalMs != 3 {
		t.Fatalf("rollback: %+v %v", rb, err)
	}
	if _, err := sb.Rollback(ctx, "nope"); !IsNotFound(err) {
		t.Errorf("unknown snapshot: %v", err)
	}
	b.busy.Store(true)
	if _, err := sb.Rollback(ctx, "one"); !IsConflict(err) {
		t.Errorf("busy: %v", err)
	}
	if g, err := c.GetSnapshot(ctx, "one"); err != nil || !g.InUse {
		t.Errorf("the sandbox should hold the snapshot it rolled back to: %+v %v", g, err)
	}
}

func TestFiles(t *testing.T) {
	c, _ := newClient(t)
	ctx := context.Background()
	sb, _ := c.Create(ctx, CreateOptions{})
	data := append([]byte("binary \x00\xff "), strings.Repeat("z", 3<<20)...)
	ei, err := sb.Files.Write(ctx, "/home/user/a b.bin", data, WriteOptions{Mode: 0o600})
	if err != nil || ei.Size != int64(len(data)) || ei.Permissions != "-rw-------" || ei.Name != "a b.bin" {
		t.Fatalf("write: %+v %v", ei, err)
	}
	if got, err := sb.Files.Read(ctx, "/home/user/a b.bin"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read: %d bytes %v", len(got), err)
	}
	if got, err := sb.Files.ReadRange(ctx, "/home/user/a b.bin", 7, 2); err != nil || string(got) != "\x00\xff" {
		t.Errorf("read range: %q %v", got, err)
	}
	if _, err := sb.Files.Write(ctx, "/home/user/a b.bin", []byte("!"), WriteOptions{Append: true}); err != nil {
		t.Fatal(err)
	}
	if ok, err := sb.Files.MakeDir(ctx, "/home/user/d/e"); !ok || err != nil {
		t.Errorf("make dir: %v %v", ok, err)
	}
	if ok, err := sb.Files.MakeDir(ctx, "/home/user/d/e"); ok || err != nil {
		t.Errorf("make an existing dir: %v %v", ok, err)
	}
	for i := 0; i < 3; i++ { // more than one page of the server's (limit 500): enough to check the order
		sb.Files.Write(ctx, fmt.Sprintf("/home/user/d/f%d", i), nil)
	}
	l, err := sb.Files.List(ctx, "/home/user/d")
	if err != nil || len(l) != 4 || l[0].Name != "e" || l[0].Type != "dir" || l[3].Path != "/home/user/d/f2" {
		t.Fatalf("list: %+v %v", l, err)
	}
	if fi, err := sb.Files.GetInfo(ctx, "/home/user/d"); err != nil || fi.Type != "dir" {
		t.Errorf("get info: %+v %v", fi, err)
	}
	if err := sb.Files.Remove(ctx, "/home/user/d"); !IsConflict(err) {
		t.Errorf("remove a full dir: %v", err)
	}
	if err := sb.Files.Remove(ctx, "/home/user/d", true); err != nil {
		t.Fatal(err)
	}
	if ok, err := sb.Files.Exists(ctx, "/home/user/d"); ok || err != nil {
		t.Errorf("exists after remove: %v %v", ok, err)
	}
	if _, err := sb.Files.Read(ctx, "relative"); err == nil || !strings.Contains(err.Error(), "400") {
		t.Errorf("relative path: %v", err)
	}
}
