package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/checkpoint/clone"
	"github.com/cube-runtime/cube/checkpoint/shimclient"
	"github.com/cube-runtime/cube/checkpoint/snapshots"
	"github.com/cube-runtime/cube/checkpoint/store"
	snapapi "github.com/cube-runtime/cube/shim/snapshotapi"
)

// Containerd is the Backend over containerd's client and the shim's
// snapshot service.
type Containerd struct {
	Conn        *shimclient.Containerd
	Store       *store.Store
	Namespace   string
	Runtime     string
	Snapshotter string
	State       string // containerd's state directory
	// Net gives sandboxes whose spec asks for it a network (nil: none).
	Net *SandboxNet
	// Log is for what a call cannot return (a fork's cleanup warnings);
	// logrus's standard logger when nil.
	Log *logrus.Logger
}

func (c *Containerd) log() *logrus.Logger {
	if c.Log == nil {
		return logrus.StandardLogger()
	}
	return c.Log
}

func (c *Containerd) ctx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, c.Namespace)
}

func (c *Containerd) client() *containerd.Client { return c.Conn.Client }

// CheckImage implements Backend.
func (c *Containerd) CheckImage(ctx context.Context, ref string) error {
	_, err := c.client().GetImage(c.ctx(ctx), ref)
	if err != nil {
		return fmt.Errorf("image %s in namespace %s: %w", ref, c.Namespace, err)
	}
	return nil
}

// Create implements Backend: the container (labels, image's rootfs in the
// snapshotter, the runtime) and its started task.
func (c *Containerd) Create(ctx context.Context, spec CreateSpec) (Container, error) {
	ctx = c.ctx(ctx)
	img, err := c.client().GetImage(ctx, spec.Image)
	if err != nil {
		return Container{}, fmt.Errorf("image %s: %w", spec.Image, err)
	}
	if ok, err := img.IsUnpacked(ctx, c.Snapshotter); err != nil || !ok {
		if err := img.Unpack(ctx, c.Snapshotter); err != nil {
			return Container{}, fmt.Errorf("unpack image %s into snapshotter %s: %w", spec.Image, c.Snapshotter, err)
		}
	}
	opts := []oci.SpecOpts{oci.WithImageConfig(img), oci.WithEnv(spec.Env)}
	if len(spec.Command) > 0 {
		opts = append(opts, oci.WithProcessArgs(spec.Command...))
	}
	if spec.Network != nil && c.Net != nil {
		opts = append(opts, c.withNetwork(*spec.Network))
	}
	ctr, err := c.client().NewContainer(ctx, spec.ID,
		containerd.WithImage(img), containerd.WithSnapshotter(c.Snapshotter),
		containerd.WithNewSnapshot(spec.ID+"-rootfs", img), containerd.WithRuntime(c.Runtime, nil),
		containerd.WithNewSpec(opts...), containerd.WithContainerLabels(spec.Labels))
	if err != nil {
		return Container{}, fmt.Errorf("create container %s: %w", spec.ID, err)
	}
	task, err := ctr.NewTask(ctx, cio.NullIO)
	if err == nil {
		if err = task.Start(ctx); err != nil {
			_, _ = task.Delete(context.WithoutCancel(ctx), containerd.WithProcessKill)
		}
	}
	if err != nil {
		_ = ctr.Delete(context.WithoutCancel(ctx), containerd.WithSnapshotCleanup)
		return Container{}, fmt.Errorf("start sandbox %s: %w", spec.ID, err)
	}
	return c.Get(ctx, spec.ID)
}

// listStatusTimeout bounds how long List waits for one sandbox's task
// status: a shim busy with a long create, restore or delete answers late,
// and one such sandbox must not fail the whole list (it is listed with
// Status StatusUnknown).
const listStatusTimeout = 5 * time.Second

// listWorkers is how many sandboxes List describes at once.
const listWorkers = 8

// List implements Backend.
func (c *Containerd) List(ctx context.Context) ([]Container, error) {
	ctx = c.ctx(ctx)
	cs, err := c.client().Containers(ctx)
	if err != nil {
		return nil, fmt.Errorf("list containers in namespace %s: %w", c.Namespace, err)
	}
	type result struct {
		ct  Container
		err error
	}
	res := make([]result, len(cs))
	sem := make(chan struct{}, listWorkers)
	var wg sync.WaitGroup
	for i, ctr := range cs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			res[i].ct, res[i].err = c.describeWithin(ctx, ctr, listStatusTimeout)
		})
	}
	wg.Wait()
	var out []Container
	for _, r := range res {
		if errdefs.IsNotFound(r.err) {
			continue // deleted meanwhile, or not a sandbox
		}
		if r.err != nil {
			return nil, r.err
		}
		out = append(out, r.ct)
	}
	return out, nil
}

// describe reads a sandbox's labels and task status (NotFound: not a sandbox).
func (c *Containerd) describe(ctx context.Context, ctr containerd.Container) (Container, error) {
	return c.describeWithin(ctx, ctr, 0)
}

// describeWithin is describe with the task's status bounded by within (0:
// ctx alone bounds it): a status that does not come in time, or fails, is
// StatusUnknown, logged, and not an error.
func (c *Containerd) describeWithin(ctx context.Context, ctr containerd.Container, within time.Duration) (Container, error) {
	info, err := ctr.Info(ctx, containerd.WithoutRefreshedMetadata)
	if err != nil {
		return Container{}, fmt.Errorf("container %s: %w", ctr.ID(), err)
	}
	if info.Labels[LabelSandbox] != "1" {
		return Container{}, fmt.Errorf("container %s is not a sandbox of cube-api: %w", ctr.ID(), errdefs.ErrNotFound)
	}
	out := Container{ID: info.ID, Image: info.Image, Labels: info.Labels, Created: info.CreatedAt}
	sctx := ctx
	if within > 0 {
		var cancel context.CancelFunc
		sctx, cancel = context.WithTimeout(ctx, within)
		defer cancel()
	}
	st, err := taskStatus(sctx, ctr)
	switch {
	case errdefs.IsNotFound(err):
		return out, nil
	case err != nil && within > 0 && ctx.Err() == nil:
		c.log().WithError(err).WithField("sandbox", ctr.ID()).Warn("list: its task's status did not come in time: listed as unknown")
		out.Status = StatusUnknown
		return out, nil
	case err != nil:
		return Container{}, fmt.Errorf("sandbox %s: %w", ctr.ID(), err)
	}
	out.Status = st
	return out, nil
}

// taskStatus is ctr's task's status (NotFound: it has no task).
func taskStatus(ctx context.Context, ctr containerd.Container) (string, error) {
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		return "", fmt.Errorf("its task: %w", err)
	}
	st, err := task.Status(ctx)
	if err != nil {
		return "", fmt.Errorf("its task's status: %w", err)
	}
	return string(st.Status), nil
}

// load returns sandbox id's container.
func (c *Containerd) load(ctx context.Context, id string) (containerd.Container, error) {
	ctr, err := c.client().LoadContainer(c.ctx(ctx), id)
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("no sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	if _, err := c.describe(c.ctx(ctx), ctr); err != nil {
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("no sandbox %s: %w", id, errdefs.ErrNotFound)
		}
		return nil, err
	}
	return ctr, nil
}

// Get implements Backend.
func (c *Containerd) Get(ctx context.Context, id string) (Container, error) {
	ctr, err := c.load(ctx, id)
	if err != nil {
		return Container{}, err
	}
	return c.describe(c.ctx(ctx), ctr)
}

// task returns sandbox id's task.
func (c *Containerd) task(ctx context.Context, id string) (containerd.Task, error) {
	ctr, err := c.load(ctx, id)
	if err != nil {
		return nil, err
	}
	t, err := ctr.Task(c.ctx(ctx), nil)
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("sandbox %s has no task (it stopped): %w", id, errdefs.ErrConflict)
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: its task: %w", id, err)
	}
	return t, nil
}

// Delete implements Backend.
func (c *Containerd) Delete(ctx context.Context, id string) error {
	ctr, err := c.load(ctx, id)
	if err != nil {
		return err
	}
	ctx = c.ctx(ctx)
	if t, err := ctr.Task(ctx, nil); err == nil {
		if _, err := t.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("kill sandbox %s: %w", id, err)
		}
	} else if !errdefs.IsNotFound(err) {
		return fmt.Errorf("sandbox %s: its task: %w", id, err)
	}
	if err := ctr.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	return nil
}

// Pause implements Backend.
func (c *Containerd) Pause(ctx context.Context, id string) error {
	t, err := c.task(ctx, id)
	if err != nil {
		return err
	}
	if err := t.Pause(c.ctx(ctx)); err != nil {
		return fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	return nil
}

// Resume implements Backend.
func (c *Containerd) Resume(ctx context.Context, id string) error {
	t, err := c.task(ctx, id)
	if err != nil {
		return err
	}
	if err := t.Resume(c.ctx(ctx)); err != nil {
		return fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	return nil
}

// SetLabels implements Backend.
func (c *Containerd) SetLabels(ctx context.Context, id string, labels map[string]string) error {
	ctr, err := c.load(ctx, id)
	if err != nil {
		return err
	}
	if _, err := ctr.SetLabels(c.ctx(ctx), labels); err != nil {
		return fmt.Errorf("sandbox %s: set labels: %w", id, err)
	}
	return nil
}

// shimOf dials the shim of sandbox id; the caller closes it.
func (c *Containerd) shimOf(ctx context.Context, id string) (*shimclient.Client, shimclient.Target, error) {
	if _, err := c.load(ctx, id); err != nil {
		return nil, shimclient.Target{}, err
	}
	l := shimclient.Locator{State: c.State, Address: c.Conn.Address, Namespace: c.Namespace}
	target, err := shimclient.Resolve(ctx, c.Conn, l, id)
	if err != nil {
		return nil, shimclient.Target{}, err
	}
	sh, err := shimclient.Dial(ctx, target.Address)
	if err != nil {
		return nil, shimclient.Target{}, fmt.Errorf("sandbox %s: its shim: %w", id, err)
	}
	return sh, target, nil
}

// Snapshot implements Backend: snapshots.Take through the sandbox's shim.
func (c *Containerd) Snapshot(ctx context.Context, id string, names []string) (snapshots.Taken, error) {
	sh, target, err := c.shimOf(ctx, id)
	if err != nil {
		return snapshots.Taken{}, err
	}
	defer sh.Close()
	// The container record (image, snapshotter, runtime, spec) goes into the
	// snapshot: creating a sandbox from it makes the container from it.
	rec, err := (&clone.Containerd{Client: c.client(), Namespace: c.Namespace}).Record(ctx, id)
	if err != nil {
		return snapshots.Taken{}, fmt.Errorf("snapshot of sandbox %s: %w", id, err)
	}
	t, err := snapshots.Take(ctx, c.Store, sh, snapshots.Options{Container: id,
		Sandbox: snapshots.SandboxKey(c.Namespace, target.Container.Group), Names: names,
		Before: func(dir string) error { return clone.WriteRecord(dir, rec) }})
	return t, takeError(err)
}

// Rollback implements Backend: snapshots.Rollback through the sandbox's shim.
func (c *Containerd) Rollback(ctx context.Context, id, ref string) (snapshots.RolledBack, error) {
	sh, target, err := c.shimOf(ctx, id)
	if err != nil {
		return snapshots.RolledBack{}, err
	}
	defer sh.Close()
	rb, err := snapshots.Rollback(ctx, c.Store, sh, snapshots.RollbackOptions{Container: id,
		Sandbox: snapshots.SandboxKey(c.Namespace, target.Container.Group), Ref: ref})
	return rb, takeError(err)
}

// GuestProcesses implements Backend: the shim's ListProcesses, the
// sandbox's own container's processes.
func (c *Containerd) GuestProcesses(ctx context.Context, id string) ([]GuestProcess, error) {
	sh, _, err := c.shimOf(ctx, id)
	if err != nil {
		return nil, err
	}
	defer sh.Close()
	resp, err := sh.ListProcesses(ctx, &snapapi.ListProcessesRequest{ContainerId: id})
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: the guest's processes: %w", id, err)
	}
	var out []GuestProcess
	for _, p := range resp.GetProcesses() {
		if p.GetContainerId() != id {
			continue
		}
		out = append(out, GuestProcess{ExecID: p.GetExecId(), Pid: p.GetPid(), Running: p.GetStatus() == "running", Known: p.GetKnown()})
	}
	return out, nil
}

// SignalGuest implements Backend: the shim's Signal.
func (c *Containerd) SignalGuest(ctx context.Context, id, execID string, sig syscall.Signal) error {
	sh, _, err := c.shimOf(ctx, id)
	if err != nil {
		return err
	}
	defer sh.Close()
	if _, err := sh.Signal(ctx, &snapapi.SignalRequest{ContainerId: id, ExecId: execID, Signal: uint32(sig)}); err != nil {
		return fmt.Errorf("sandbox %s: signal %d to %s: %w", id, sig, execID, err)
	}
	return nil
}

// parseUser reads "root", "UID" or "UID:GID" (names would need the guest's /etc/passwd).
func parseUser(u string) (specs.User, error) {
	if u == "" || u == "root" {
		return specs.User{}, nil
	}
	us, gs, hasGID := strings.Cut(u, ":")
	uid, err1 := strconv.ParseUint(us, 10, 32)
	gid, err2 := uint64(0), error(nil)
	if hasGID {
		gid, err2 = strconv.ParseUint(gs, 10, 32)
	}
	if err1 != nil || err2 != nil {
		return specs.User{}, invalid("field \"user\": %q: want root, UID or UID:GID (numeric)", u)
	}
	return specs.User{UID: uint32(uid), GID: uint32(gid)}, nil
}

// Exec implements Backend: a task exec with the sandbox's process spec,
// the command, env added and cwd and user replaced.
func (c *Containerd) Exec(ctx context.Context, id string, es ExecSpec, eio ExecIO) (Process, error) {
	user, err := parseUser(es.User)
	if err != nil {
		return nil, err
	}
	ctr, err := c.load(ctx, id)
	if err != nil {
		return nil, err
	}
	ctx = c.ctx(ctx)
	spec, err := ctr.Spec(ctx)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: its spec: %w", id, err)
	}
	t, err := c.task(ctx, id)
	if err != nil {
		return nil, err
	}
	p := *spec.Process
	p.Terminal = false
	p.Args = append([]string{es.Cmd}, es.Args...)
	p.Env = append(append([]string(nil), p.Env...), es.Env...)
	if es.Cwd != "" {
		p.Cwd = es.Cwd
	}
	if es.User != "" {
		p.User = user
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	execID := ExecIDPrefix + hex.EncodeToString(b)
	var stdin io.Reader
	var stdinDone chan struct{}
	if eio.Stdin != nil {
		stdinDone = make(chan struct{})
		stdin = &eofReader{r: eio.Stdin, done: stdinDone}
	}
	proc, err := t.Exec(ctx, execID, &p, cio.NewCreator(cio.WithStreams(stdin, eio.Stdout, eio.Stderr)))
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: exec %s: %w", id, es.Cmd, err)
	}
	exitC, err := proc.Wait(ctx)
	if err == nil {
		err = proc.Start(ctx)
	}
	if err != nil {
		_, _ = proc.Delete(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("sandbox %s: start %s: %w", id, es.Cmd, err)
	}
	// containerd's pid of an io.cube.v1 process is the VMM's host pid, the
	// same for every exec: the API names a command by its guest pid.
	pid, err := c.guestPid(ctx, id, execID)
	if err != nil {
		_ = proc.Kill(context.WithoutCancel(ctx), syscall.SIGKILL)
		_, _ = proc.Delete(context.WithoutCancel(ctx), containerd.WithProcessKill)
		return nil, fmt.Errorf("sandbox %s: %s started, but its guest pid is unknown (it was killed): %w", id, es.Cmd, err)
	}
	return &execProcess{p: proc, pid: pid, exitC: exitC, ns: c.Namespace, stdinDone: stdinDone}, nil
}

// guestPid is the guest pid of exec execID of sandbox id (the shim's
// ListProcesses).
func (c *Containerd) guestPid(ctx context.Context, id, execID string) (uint32, error) {
	ps, err := c.GuestProcesses(ctx, id)
	if err != nil {
		return 0, err
	}
	for _, p := range ps {
		if p.ExecID == execID && p.Pid != 0 {
			return p.Pid, nil
		}
	}
	return 0, fmt.Errorf("the guest does not list exec %s: %w", execID, errdefs.ErrNotFound)
}

// eofReader closes done once r reached its end: cio's copy into the fifo
// has then written everything before it.
type eofReader struct {
	r    io.Reader
	done chan struct{}
	once sync.Once
}

func (e *eofReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil {
		e.once.Do(func() { close(e.done) })
	}
	return n, err
}

// execProcess is a containerd exec as a Process.
type execProcess struct {
	p     containerd.Process
	pid   uint32 // in the guest
	exitC <-chan containerd.ExitStatus
	ns    string
	// stdinDone is closed when the input was copied to the end (nil: no stdin).
	stdinDone chan struct{}
}

func (e *execProcess) Pid() uint32 { return e.pid }

func (e *execProcess) ExecID() string { return e.p.ID() }

// ioDrain bounds waiting for the output after the exit (a background child
// holding stdout open would hold it forever).
const ioDrain = 2 * time.Second

func (e *execProcess) Wait(ctx context.Context) (int, error) {
	var st containerd.ExitStatus
	select {
	case st = <-e.exitC:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	drained := make(chan struct{})
	go func() { e.p.IO().Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(ioDrain):
	}
	code, _, err := st.Result()
	dctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), e.ns), 30*time.Second)
	defer cancel()
	if _, derr := e.p.Delete(dctx); derr != nil && err == nil && !errdefs.IsNotFound(derr) {
		err = fmt.Errorf("delete exec: %w", derr)
	}
	return int(code), err
}

func (e *execProcess) Kill(ctx context.Context, sig syscall.Signal) error {
	return e.p.Kill(namespaces.WithNamespace(ctx, e.ns), sig)
}

// CloseStdin closes the process's stdin once what was written before has
// reached the fifo (the caller closed the input's writer first).
func (e *execProcess) CloseStdin(ctx context.Context) error {
	if e.stdinDone != nil {
		select {
		case <-e.stdinDone:
		case <-time.After(5 * time.Second):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return e.p.CloseIO(namespaces.WithNamespace(ctx, e.ns), containerd.WithStdinCloser)
}
