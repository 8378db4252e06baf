package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/checkpoint/clone"
	"github.com/cube-runtime/cube/checkpoint/snapshots"
	"github.com/cube-runtime/cube/checkpoint/store"
	"github.com/cube-runtime/cube/checkpoint/store/storetest"
	snapapi "github.com/cube-runtime/cube/shim/snapshotapi"
)

// fakeBackend is containerd for the unit tests: containers in a map, execs
// run little built-in programs, snapshots go through snapshots.Take into a
// real store with a fake shim that writes synthetic VM snapshots.
type fakeBackend struct {
	mu      sync.Mutex
	images  map[string]bool
	ctrs    map[string]*Container
	specs   map[string]CreateSpec
	st      *store.Store
	ns      string
	pid     uint32
	failErr error // returned by every call when set
	// execs are the programs of the processes started, in order.
	execs []string
	// snapBlock, when set, is waited on inside Snapshot (to test "busy").
	snapBlock chan struct{}
	snapping  map[string]bool
	// guest is each sandbox's guest processes by exec id; snapGuest what
	// each snapshot saw (a rollback brings it back).
	guest     map[string]map[string]*fakeGuestProc
	snapGuest map[string]map[string]fakeGuestProc
	// rollbackBlock, when set, is waited on inside Rollback; rollbackErr is
	// the shim's answer when set.
	rollbackBlock chan struct{}
	rollbackErr   error
	// policies are the egress policies set through the network route.
	policies map[string]NetworkPolicy
	// makeErr fails the nth clone or restore made (from 1); madeFrom is
	// the snapshot directory each one was made from.
	makes    int
	makeErr  map[int]error
	madeFrom map[string]string
	// DirFiles is the guest's file system: a directory per sandbox.
	*DirFiles
}

// fakeGuestProc is a process of the fake guest.
type fakeGuestProc struct {
	pid     uint32
	running bool
	known   bool
	proc    *fakeProc // nil for one a rollback revived
}

func newFake(st *store.Store) *fakeBackend {
	return &fakeBackend{images: map[string]bool{"docker.io/library/busybox:latest": true}, ctrs: map[string]*Container{},
		specs: map[string]CreateSpec{}, st: st, ns: DefaultNamespace, pid: 100, snapping: map[string]bool{},
		guest: map[string]map[string]*fakeGuestProc{}, snapGuest: map[string]map[string]fakeGuestProc{},
		makeErr: map[int]error{}, madeFrom: map[string]string{}}
}

func (f *fakeBackend) CheckImage(ctx context.Context, ref string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.images[ref] {
		return fmt.Errorf("image %q: %w", ref, errdefs.ErrNotFound)
	}
	return nil
}

func (f *fakeBackend) Create(ctx context.Context, spec CreateSpec) (Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failErr != nil {
		return Container{}, f.failErr
	}
	c := &Container{ID: spec.ID, Image: spec.Image, Labels: spec.Labels, Created: time.Now(), Status: "running"}
	f.ctrs[spec.ID], f.specs[spec.ID] = c, spec
	return *c, nil
}

func (f *fakeBackend) List(ctx context.Context) ([]Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failErr != nil {
		return nil, f.failErr
	}
	var out []Container
	for _, c := range f.ctrs {
		out = append(out, f.copyOf(c))
	}
	return out, nil
}

func (f *fakeBackend) copyOf(c *Container) Container {
	cp := *c
	cp.Labels = map[string]string{}
	for k, v := range c.Labels {
		cp.Labels[k] = v
	}
	return cp
}

func (f *fakeBackend) get(id string) (*Container, error) {
	if f.failErr != nil {
		return nil, f.failErr
	}
	c := f.ctrs[id]
	if c == nil {
		return nil, fmt.Errorf("no sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return c, nil
}

func (f *fakeBackend) Get(ctx context.Context, id string) (Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, err := f.get(id)
	if err != nil {
		return Container{}, err
	}
	return f.copyOf(c), nil
}

func (f *fakeBackend) Delete(ctx context.Context, id string) error {
	f.mu.Lock()
	c, err := f.get(id)
	if err != nil {
		f.mu.Unlock()
		return err
	}
	delete(f.ctrs, id)
	f.mu.Unlock()
	// Its VMM is gone: so is its reference to the snapshot it was restored from.
	if sn := c.Labels[clone.LabelRestoredFrom]; sn != "" {
		return f.st.Release(ctx, sn, snapshots.Holder(snapshots.SandboxKey(f.ns, id)))
	}
	return nil
}

func (f *fakeBackend) setStatus(id, from, to string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, err := f.get(id)
	if err != nil {
		return err
	}
	if c.Status != from {
		return fmt.Errorf("task is %s: %w", c.Status, errdefs.ErrFailedPrecondition)
	}
	c.Status = to
	return nil
}

func (f *fakeBackend) Pause(ctx context.Context, id string) error {
	return f.setStatus(id, "running", "paused")
}

func (f *fakeBackend) Resume(ctx context.Context, id string) error {
	return f.setStatus(id, "paused", "running")
}

func (f *fakeBackend) SetLabels(ctx context.Context, id string, labels map[string]string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, err := f.get(id)
	if err != nil {
		return err
	}
	for k, v := range labels {
		c.Labels[k] = v
	}
	return nil
}

// fakeShim writes a synthetic VM snapshot where the store says.
type fakeShim struct{ f *fakeBackend }

func (s fakeShim) Snapshot(ctx context.Context, req *snapapi.SnapshotRequest) (*snapapi.SnapshotResponse, error) {
	if b := s.f.snapBlock; b != nil {
		<-b
	}
	if err := storetest.Write(req.Dir, ""); err != nil {
		return nil, err
	}
	return &snapapi.SnapshotResponse{Snapshot: &snapapi.Snapshot{Id: req.Id, Timings: &snapapi.Timings{FrozenMs: 1.5, TotalMs: 7}}}, nil
}

func (s fakeShim) List(ctx context.Context, req *snapapi.ListRequest) (*snapapi.ListResponse, error) {
	return &snapapi.ListResponse{}, nil
}

func (f *fakeBackend) Snapshot(ctx context.Context, id string, names []string) (snapshots.Taken, error) {
	f.mu.Lock()
	if _, err := f.get(id); err != nil {
		f.mu.Unlock()
		return snapshots.Taken{}, err
	}
	if f.snapping[id] {
		f.mu.Unlock()
		return snapshots.Taken{}, takeError(fmt.Errorf("sandbox %s is busy: a snapshot runs: %w", id, errdefs.ErrUnavailable))
	}
	f.snapping[id] = true
	f.mu.Unlock()
	defer func() { f.mu.Lock(); delete(f.snapping, id); f.mu.Unlock() }()
	rec, err := fakeMaker{f}.Record(ctx, id)
	if err != nil {
		return snapshots.Taken{}, err
	}
	t, err := snapshots.Take(ctx, f.st, fakeShim{f}, snapshots.Options{Container: id, Sandbox: snapshots.SandboxKey(f.ns, id), Names: names,
		Before: func(dir string) error { return clone.WriteRecord(dir, rec) }})
	if err == nil {
		f.recordGuest(id, t.Snapshot.ID)
	}
	return t, err
}

// fakeProc runs one of the built-in programs: echo ARGS (stdout), fail
// (stderr "boom", exit 3), cat (stdin to stdout), sleep (until killed: 137).
type fakeProc struct {
	pid    uint32
	execID string
	done   chan struct{}
	code   int
	killC  chan syscall.Signal
	stdinC chan struct{}
	// ended is closed by a rollback that ends the process (137).
	ended   chan struct{}
	f       *fakeBackend
	sandbox string
}

func (p *fakeProc) Pid() uint32    { return p.pid }
func (p *fakeProc) ExecID() string { return p.execID }
func (p *fakeProc) Wait(ctx context.Context) (int, error) {
	select {
	case <-p.done:
		// Wait deletes the exec (the guest forgets it).
		if p.f != nil {
			p.f.mu.Lock()
			if g := p.f.guest[p.sandbox][p.execID]; g != nil && g.proc == p {
				delete(p.f.guest[p.sandbox], p.execID)
			}
			p.f.mu.Unlock()
		}
		return p.code, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (p *fakeProc) Kill(ctx context.Context, sig syscall.Signal) error {
	select {
	case p.killC <- sig:
	case <-p.done:
		return fmt.Errorf("process %d exited: %w", p.pid, errdefs.ErrNotFound)
	}
	return nil
}

func (p *fakeProc) CloseStdin(ctx context.Context) error { return nil }

func (f *fakeBackend) Exec(ctx context.Context, id string, es ExecSpec, eio ExecIO) (Process, error) {
	if _, err := parseUser(es.User); err != nil {
		return nil, err
	}
	f.mu.Lock()
	c, err := f.get(id)
	if err == nil && c.Status != "running" {
		err = fmt.Errorf("sandbox %s is %s: %w", id, c.Status, errdefs.ErrFailedPrecondition)
	}
	f.pid++
	f.execs = append(f.execs, es.Cmd)
	p := &fakeProc{pid: f.pid, execID: fmt.Sprintf("%s%d", ExecIDPrefix, f.pid), done: make(chan struct{}),
		killC: make(chan syscall.Signal), ended: make(chan struct{}), f: f, sandbox: id}
	if err == nil && es.Cmd != "nonexistent" {
		if f.guest[id] == nil {
			f.guest[id] = map[string]*fakeGuestProc{}
		}
		f.guest[id][p.execID] = &fakeGuestProc{pid: p.pid, running: true, known: true, proc: p}
	}
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if es.Cmd == "nonexistent" {
		return nil, fmt.Errorf("exec %s: no such file: %w", es.Cmd, errdefs.ErrFailedPrecondition)
	}
	go func() {
		defer close(p.done)
		defer func() {
			f.mu.Lock()
			if g := f.guest[id][p.execID]; g != nil && g.proc == p {
				g.running = false
			}
			f.mu.Unlock()
		}()
		// A command line (E2B's SDK: /bin/bash -l -c LINE): built-in programs
		// separated by "; ", each to stderr with ">&2".
		if (es.Cmd == "/bin/bash" || es.Cmd == "/bin/sh") && len(es.Args) >= 2 && es.Args[len(es.Args)-2] == "-c" {
			p.code = f.fakeLine(id, es.Args[len(es.Args)-1], eio, p)
			return
		}
		switch es.Cmd {
		case "exit":
			if len(es.Args) > 0 {
				p.code, _ = strconv.Atoi(es.Args[0])
			}
		case "echo":
			fmt.Fprintln(eio.Stdout, strings.Join(append(append([]string{}, es.Args...), es.Env...), " "))
		case "fail":
			fmt.Fprint(eio.Stdout, "out\n")
			fmt.Fprint(eio.Stderr, "boom\n")
			p.code = 3
		case "cat":
			if eio.Stdin != nil {
				_, _ = io.Copy(eio.Stdout, eio.Stdin)
			}
		case "sleep":
			select {
			case sig := <-p.killC:
				p.code = 128 + int(sig)
			case <-p.ended:
				p.code = 137
			}
		}
	}()
	return p, nil
}

// env is a server over a fake backend and a real store, served by httptest.
type env struct {
	t    *testing.T
	f    *fakeBackend
	st   *store.Store
	s    *Server
	srv  *httptest.Server
	key  string
	now  time.Time
	mu   sync.Mutex
	logs *bytes.Buffer
}

func (e *env) clock() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.now
}

func (e *env) advance(d time.Duration) {
	e.mu.Lock()
	e.now = e.now.Add(d)
	e.mu.Unlock()
}

func newEnv(t *testing.T, mod func(*Config), keys ...string) *env {
	t.Helper()
	st, err := store.Open(context.Background(), t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.MaxBodyBytes = 4096
	if mod != nil {
		mod(&cfg)
	}
	f := newFake(st)
	f.DirFiles = &DirFiles{Root: t.TempDir()}
	e := &env{t: t, f: f, st: st, now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC), logs: &bytes.Buffer{}}
	log := logrus.New()
	log.SetOutput(e.logs)
	log.SetLevel(logrus.DebugLevel)
	e.s, err = New(cfg, keys, e.f, st, Options{Log: log, Now: e.clock})
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) > 0 {
		e.key = keys[0]
	}
	e.srv = httptest.NewServer(e.s.Handler())
	t.Cleanup(func() { e.s.Stop(); e.srv.Close() })
	return e
}

// do sends a request (body: a string sent as is, or a value as JSON) and
// returns the response with its body read.
func (e *env) do(method, path string, body any, hdr ...string) (*http.Response, []byte) {
	e.t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		r = bytes.NewReader(j)
	}
	req, _ := http.NewRequest(method, e.srv.URL+path, r)
	if e.key != "" {
		req.Header.Set("Authorization", "Bearer "+e.key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// want checks the status and decodes the body into v (when not nil).
func (e *env) want(method, path string, body any, code int, v any) http.Header {
	e.t.Helper()
	resp, b := e.do(method, path, body)
	if resp.StatusCode != code {
		e.t.Fatalf("%s %s: status %d, want %d: %s", method, path, resp.StatusCode, code, b)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			e.t.Fatalf("%s %s: body %q: %v", method, path, b, err)
		}
	}
	return resp.Header
}

// wantError checks an error response: status, {code, message} and that the
// message holds each of parts.
func (e *env) wantError(method, path string, body any, code int, parts ...string) {
	e.t.Helper()
	resp, b := e.do(method, path, body)
	var er Error
	if err := json.Unmarshal(b, &er); err != nil || resp.StatusCode != code || er.Code != code {
		e.t.Fatalf("%s %s: status %d body %s, want an error %d", method, path, resp.StatusCode, b, code)
	}
	for _, p := range parts {
		if !strings.Contains(er.Message, p) {
			e.t.Errorf("%s %s: message %q lacks %q", method, path, er.Message, p)
		}
	}
}

// create makes a sandbox of busybox.
func (e *env) create(body map[string]any) Sandbox {
	e.t.Helper()
	if body == nil {
		body = map[string]any{}
	}
	if _, ok := body["templateID"]; !ok {
		body["templateID"] = "docker.io/library/busybox:latest"
	}
	var sb Sandbox
	e.want("POST", "/sandboxes", body, http.StatusCreated, &sb)
	return sb
}

// fakeRollbackShim rolls the fake guest back: the processes of the
// snapshot run again (unknown to containerd when it deleted them), the
// ones started after it end.
type fakeRollbackShim struct {
	f  *fakeBackend
	id string
}

func (s fakeRollbackShim) List(ctx context.Context, req *snapapi.ListRequest) (*snapapi.ListResponse, error) {
	return &snapapi.ListResponse{VmmPid: uint32(os.Getpid())}, nil
}

func (s fakeRollbackShim) Rollback(ctx context.Context, req *snapapi.RollbackRequest) (*snapapi.RollbackResponse, error) {
	if b := s.f.rollbackBlock; b != nil {
		<-b
	}
	if s.f.rollbackErr != nil {
		return nil, s.f.rollbackErr
	}
	f := s.f
	f.mu.Lock()
	defer f.mu.Unlock()
	then := f.snapGuest[req.Id]
	resp := &snapapi.RollbackResponse{SandboxId: s.id, Id: req.Id, VmmPid: uint32(os.Getpid()), Memory: "rewrite-dirty",
		Timings: &snapapi.RollbackTimings{VmmFrozenMs: 2, ShimTotalMs: 9}}
	now := f.guest[s.id]
	if now == nil {
		now = map[string]*fakeGuestProc{}
		f.guest[s.id] = now
	}
	for e, g := range now {
		if _, ok := then[e]; !ok && g.running {
			if g.proc != nil {
				close(g.proc.ended)
			}
			delete(now, e)
			resp.Processes = append(resp.Processes, &snapapi.ProcessChange{ContainerId: s.id, ExecId: e, Pid: g.pid, Action: "ended", Status: "stopped"})
		}
	}
	for e, g := range then {
		if !g.running {
			continue
		}
		if cur := now[e]; cur != nil && cur.running {
			resp.Processes = append(resp.Processes, &snapapi.ProcessChange{ContainerId: s.id, ExecId: e, Pid: g.pid, Action: "reattached", Status: "running"})
			continue
		}
		now[e] = &fakeGuestProc{pid: g.pid, running: true}
		resp.Processes = append(resp.Processes, &snapapi.ProcessChange{ContainerId: s.id, ExecId: e, Pid: g.pid, Action: "unknown", Status: "running"})
	}
	return resp, nil
}

func (f *fakeBackend) Rollback(ctx context.Context, id, ref string) (snapshots.RolledBack, error) {
	f.mu.Lock()
	if _, err := f.get(id); err != nil {
		f.mu.Unlock()
		return snapshots.RolledBack{}, err
	}
	f.mu.Unlock()
	rb, err := snapshots.Rollback(ctx, f.st, fakeRollbackShim{f, id}, snapshots.RollbackOptions{Container: id, Sandbox: snapshots.SandboxKey(f.ns, id), Ref: ref})
	return rb, takeError(err)
}

func (f *fakeBackend) GuestProcesses(ctx context.Context, id string) ([]GuestProcess, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.get(id); err != nil {
		return nil, err
	}
	var out []GuestProcess
	for e, g := range f.guest[id] {
		out = append(out, GuestProcess{ExecID: e, Pid: g.pid, Running: g.running, Known: g.known})
	}
	return out, nil
}

func (f *fakeBackend) SignalGuest(ctx context.Context, id, execID string, sig syscall.Signal) error {
	f.mu.Lock()
	g := f.guest[id][execID]
	if g == nil || !g.running {
		f.mu.Unlock()
		return fmt.Errorf("no running process %s: %w", execID, errdefs.ErrNotFound)
	}
	if g.proc == nil {
		g.running = false
		f.mu.Unlock()
		return nil
	}
	f.mu.Unlock()
	return g.proc.Kill(ctx, sig)
}

// busyErr is the shim's refusal while a snapshot or rollback runs.
func busyErr(id string) error {
	return fmt.Errorf("sandbox %s is busy: rollback of container %s runs: %w", id, id, errdefs.ErrUnavailable)
}
