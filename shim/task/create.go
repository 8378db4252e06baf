package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/core/runtime"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/shim/config"
	"github.com/cube-runtime/cube/shim/process"
	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/stdio"
)

// maxSpecSize bounds config.json (the agent refuses larger specs too).
const maxSpecSize = 1 << 20

// terminationLogTimeout bounds copying termination logs back at an exit.
const terminationLogTimeout = 10 * time.Second

// maxIDLength matches the agent's id limit.
const maxIDLength = 128

// validateID accepts what the agent accepts: [A-Za-z0-9][A-Za-z0-9._-]*.
func validateID(kind, id string) error {
	if id == "" || len(id) > maxIDLength {
		return fmt.Errorf("%s id %q: must be 1..%d characters: %w", kind, id, maxIDLength, errdefs.ErrInvalidArgument)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return fmt.Errorf("%s id %q: character %q not allowed: %w", kind, id, c, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

func readSpec(bundle string) ([]byte, *specs.Spec, error) {
	f, err := os.Open(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, nil, fmt.Errorf("read OCI spec: %w", err)
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxSpecSize+1))
	if err != nil {
		return nil, nil, fmt.Errorf("read OCI spec: %w", err)
	}
	if len(raw) > maxSpecSize {
		return nil, nil, fmt.Errorf("OCI spec larger than %d bytes: %w", maxSpecSize, errdefs.ErrInvalidArgument)
	}
	var spec specs.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return nil, nil, fmt.Errorf("parse OCI spec: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if spec.Process == nil {
		return nil, nil, fmt.Errorf("OCI spec has no process: %w", errdefs.ErrInvalidArgument)
	}
	return raw, &spec, nil
}

// specWithRoot returns the spec with root.path set to the guest mount point
// of the rootfs disk: containerd's bundles say "rootfs" (relative to the host
// bundle), which means nothing in the guest. Other fields pass through as
// they are (unknown ones included).
func specWithRoot(raw []byte, guestRoot string) ([]byte, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, fmt.Errorf("parse OCI spec: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	root := specs.Root{Path: guestRoot}
	if r, ok := fields["root"]; ok {
		var old specs.Root
		if err := json.Unmarshal(r, &old); err != nil {
			return nil, fmt.Errorf("parse OCI spec root: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		root.Readonly = old.Readonly
	}
	b, err := json.Marshal(root)
	if err != nil {
		return nil, err
	}
	fields["root"] = b
	return json.Marshal(fields)
}

// loadConfig reads the shim config named by the runtime options
// (runtimeoptions.v1: config_path, or config_body holding the TOML itself),
// or the default file.
func (s *Service) loadConfig(opts *taskOptions) (config.Config, error) {
	if opts == nil {
		return s.o.LoadConfig("")
	}
	if opts.ConfigPath != "" {
		return s.o.LoadConfig(opts.ConfigPath)
	}
	if len(opts.ConfigBody) > 0 {
		return config.Parse(opts.ConfigBody)
	}
	return s.o.LoadConfig("")
}

type taskOptions = runtimeoptions.Options

func decodeOptions(req *taskAPI.CreateTaskRequest) (*taskOptions, error) {
	if req.Options == nil || len(req.Options.GetValue()) == 0 && req.Options.GetTypeUrl() == "" {
		return nil, nil
	}
	v, err := typeurl.UnmarshalAny(req.Options)
	if err != nil {
		return nil, fmt.Errorf("decode runtime options: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if o, ok := v.(*runtimeoptions.Options); ok {
		return o, nil
	}
	// Other option types (runc's, say) carry nothing for us.
	return nil, nil
}

// Create implements taskAPI: boot the sandbox VM if this is its first
// container, attach the rootfs disk, create the container in the guest
// (parked before execve) and wire its stdio.
func (s *Service) Create(ctx context.Context, req *taskAPI.CreateTaskRequest) (_ *taskAPI.CreateTaskResponse, retErr error) {
	defer func() { retErr = errOut(retErr) }()
	if err := validateID("container", req.ID); err != nil {
		return nil, err
	}
	if req.Checkpoint != "" {
		return s.createFromCheckpoint(ctx, req)
	}
	steps := sandbox.NewSteps(time.Now())
	image, err := rootfsImage(req.Rootfs)
	if err != nil {
		return nil, err
	}
	rawSpec, spec, err := readSpec(req.Bundle)
	if err != nil {
		return nil, err
	}
	sandboxID := req.ID
	if v := spec.Annotations[SandboxIDAnnotation]; v != "" {
		sandboxID = v
	}

	s.mu.Lock()
	if _, ok := s.containers[req.ID]; ok {
		s.mu.Unlock()
		return nil, fmt.Errorf("container %s: %w", req.ID, errdefs.ErrAlreadyExists)
	}
	// Reserve the id while the (slow) boot runs without the lock.
	s.containers[req.ID] = nil
	s.mu.Unlock()
	defer func() {
		if retErr != nil {
			s.mu.Lock()
			if s.containers[req.ID] == nil {
				delete(s.containers, req.ID)
			}
			s.mu.Unlock()
		}
	}()

	sb, booted, err := s.ensureSandbox(ctx, req, sandboxID, spec, image)
	if err != nil {
		return nil, err
	}
	steps.Mark("sandbox")
	if booted {
		defer func() {
			if retErr != nil {
				s.mu.Lock()
				s.sb = nil
				s.mu.Unlock()
				_ = sb.Stop(context.WithoutCancel(ctx))
			}
		}()
	} else if sb.ID() != sandboxID {
		return nil, fmt.Errorf("container %s belongs to sandbox %s, but this shim serves sandbox %s: %w", req.ID, sandboxID, sb.ID(), errdefs.ErrInvalidArgument)
	} else if sb.State() != sandbox.StateRunning {
		return nil, fmt.Errorf("sandbox %s is %s: %w", sandboxID, sb.State(), errdefs.ErrFailedPrecondition)
	}
	// Only the container that booted the VM records it: the delete action
	// of a pod member's bundle must not kill the pod's VM.
	if booted {
		if err := sandbox.WriteRecord(req.Bundle, sandbox.Record{SandboxID: sb.ID(), Dir: sb.Dir(), VMMPid: sb.Pid(), Cgroup: sb.Cgroup()}); err != nil {
			return nil, err
		}
	}

	mountPoint, err := sb.AttachRootfs(ctx, req.ID, image)
	if err != nil {
		return nil, err
	}
	steps.Mark("rootfs")
	defer func() {
		if retErr != nil && !booted {
			_ = sb.DetachRootfs(context.WithoutCancel(ctx), req.ID)
		}
	}()

	guestSpec, err := specWithRoot(rawSpec, mountPoint)
	if err != nil {
		return nil, err
	}
	// Ordering: the raw block volumes are attached (slot, claim, guest
	// numbers) before the guest spec that names their guest numbers exists,
	// and given back on any later failure (Delete gives them back otherwise).
	vols, err := sb.AttachBlockVolumes(ctx, req.ID, spec)
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil && len(vols) > 0 {
			if err := sb.DetachBlockVolumes(context.WithoutCancel(ctx), req.ID); err != nil {
				s.o.Log.WithError(err).WithField("container", req.ID).Error("give back raw block volumes of a failed create")
			}
		}
	}()
	if guestSpec, err = withGuestDevices(guestSpec, vols); err != nil {
		return nil, err
	}
	var use volumeUse
	defer func() {
		if retErr != nil {
			s.releaseVolumes(nil, use)
		}
	}()
	if guestSpec, err = s.translateSpec(ctx, sb, req.ID, sandboxID, mountPoint, guestSpec, &use); err != nil {
		return nil, err
	}
	steps.Mark("spec")
	uris := stdioURIs{stdin: req.Stdin, stdout: req.Stdout, stderr: req.Stderr, terminal: req.Terminal || spec.Process.Terminal}
	var created sandbox.CreatedContainer
	p, err := s.newProcess(ctx, sb, req.ID, "", uris, steps, func(ctx context.Context, flags sandbox.StdioFlags) (uint32, error) {
		var err error
		created, err = sb.Agent().CreateContainer(ctx, sandbox.CreateContainerRequest{
			ContainerID: req.ID, Spec: guestSpec, Rootfs: mountPoint, Stdio: flags,
		})
		return created.Pid, err
	})
	if err != nil {
		return nil, err
	}
	c := &container{id: req.ID, bundle: req.Bundle, rootfs: image, stdio: uris, init: p, execs: map[string]*execProc{},
		guestRoot: mountPoint, volumes: use, podSandbox: spec.Annotations[ContainerTypeAnnotation] == "sandbox"}
	s.mu.Lock()
	s.containers[req.ID] = c
	s.mu.Unlock()

	pid := s.hostPid()
	s.publish(ctx, runtime.TaskCreateEventTopic, &eventstypes.TaskCreate{
		ContainerID: req.ID, Bundle: req.Bundle, Rootfs: req.Rootfs,
		IO:  &eventstypes.TaskIO{Stdin: req.Stdin, Stdout: req.Stdout, Stderr: req.Stderr, Terminal: uris.terminal},
		Pid: pid,
	})
	s.o.Log.WithFields(logrus.Fields{"container": req.ID, "booted": booted, "total_ms": sandbox.MS(steps.Total()),
		"steps_ms": steps.String(), "guest_ms": created.Timing}).Info("container created")
	return &taskAPI.CreateTaskResponse{Pid: pid}, nil
}

// ensureSandbox returns the shim's sandbox VM, booting it (with image in
// slot 0) if this is the first container. bootMu makes a second Create wait
// for a boot in progress instead of booting another VM.
func (s *Service) ensureSandbox(ctx context.Context, req *taskAPI.CreateTaskRequest, sandboxID string, spec *specs.Spec, image string) (*sandbox.Sandbox, bool, error) {
	s.bootMu.Lock()
	defer s.bootMu.Unlock()
	s.mu.Lock()
	sb := s.sb
	s.mu.Unlock()
	if sb != nil {
		return sb, false, nil
	}
	opts, err := decodeOptions(req)
	if err != nil {
		return nil, false, err
	}
	cfg, err := s.loadConfig(opts)
	if err != nil {
		return nil, false, err
	}
	if sb, err = s.o.NewSandbox(ctx, sandboxID, cfg, spec, req.Bundle); err != nil {
		return nil, false, fmt.Errorf("sandbox %s: %w", sandboxID, err)
	}
	if err := sb.Start(ctx, image, req.ID); err != nil {
		return nil, false, err
	}
	s.startVolumes(sb)
	s.mu.Lock()
	s.sb = sb
	s.mu.Unlock()
	go s.watchSandbox(sb)
	return sb, true, nil
}

// newProcess opens the host stdio, creates the guest process with create,
// attaches the streams it asked for, and returns the process (created state).
func (s *Service) newProcess(ctx context.Context, sb *sandbox.Sandbox, cid, eid string, uris stdioURIs, steps *sandbox.Steps,
	create func(context.Context, sandbox.StdioFlags) (uint32, error)) (_ *process.Process, retErr error) {
	log := s.o.Log.WithField("container", cid)
	if eid != "" {
		log = log.WithField("exec", eid)
	}
	cfg := stdio.Config{Stdin: uris.stdin, Stdout: uris.stdout, Stderr: uris.stderr, Terminal: uris.terminal}
	hio, err := stdio.Open(ctx, cid, s.o.Namespace, cfg, log)
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			hio.Close()
		}
	}()
	steps.Mark("stdio")
	in, out, errw := cfg.Wants()
	agent := sb.Agent()
	wants := []bool{in, out, errw}
	// Ordering: the streams' connections are dialed while the guest
	// creates the process (a vsock handshake through the VMM and a guest
	// accept each, which need not wait for it); their headers, which name
	// the process, are sent once it exists.
	dialed := predialStreams(ctx, agent, wants)
	pid, err := create(ctx, sandbox.StdioFlags{Stdin: in, Stdout: out, Stderr: errw})
	if err != nil {
		dialed.close()
		return nil, fmt.Errorf("create process in the guest: %w", err)
	}
	steps.Mark("guest")
	defer func() {
		if retErr != nil {
			_, _ = agent.Delete(context.WithoutCancel(ctx), cid, eid, true)
		}
	}()
	var conns [3]net.Conn
	defer func() {
		if retErr != nil {
			for _, c := range conns {
				if c != nil {
					c.Close()
				}
			}
		}
	}()
	// The streams do not depend on each other: they are opened together
	// (each is a vsock connection through the VMM and a guest accept).
	var errs [3]error
	var wg sync.WaitGroup
	for i, want := range wants {
		if !want {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := []sandbox.Stream{sandbox.Stdin, sandbox.Stdout, sandbox.Stderr}[i]
			if conns[i], errs[i] = dialed.attach(ctx, agent, i, cid, eid, name); errs[i] != nil {
				errs[i] = fmt.Errorf("attach %s: %w", name, errs[i])
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	steps.Mark("streams")
	var guestIn stdio.HalfCloser
	if conns[0] != nil {
		guestIn = halfCloser(conns[0])
	}
	var guestOut, guestErr io.ReadCloser
	if conns[1] != nil {
		guestOut = conns[1]
	}
	if conns[2] != nil {
		guestErr = conns[2]
	}
	hio.Attach(guestIn, guestOut, guestErr)
	return process.New(process.Options{
		ContainerID: cid, ExecID: eid, Agent: agent, IO: hio, GuestPid: pid,
		VMDone: sb.Done(), OnExit: s.processExited, Log: log,
	}), nil
}

// halfCloser gives a conn without CloseWrite (not a Unix socket) one that
// closes it entirely: EOF for the guest all the same.
func halfCloser(c net.Conn) stdio.HalfCloser {
	if h, ok := c.(stdio.HalfCloser); ok {
		return h
	}
	return fullCloser{c}
}

type fullCloser struct{ net.Conn }

func (f fullCloser) CloseWrite() error { return f.Conn.Close() }

// processExited publishes the exit event, after the start event (lifecycleMu).
func (s *Service) processExited(p *process.Process) {
	if p.ExecID() == "" {
		// Ordering: the kubelet reads the termination message once it
		// learns of the exit.
		s.mu.Lock()
		c := s.containers[p.ContainerID()]
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), terminationLogTimeout)
		s.copyTerminationLogs(ctx, c)
		cancel()
	}
	s.lifecycleMu.Lock()
	defer s.lifecycleMu.Unlock()
	e := p.ExitStatus()
	s.o.Log.WithFields(logrus.Fields{"container": p.ContainerID(), "exec": p.ExecID(), "status": e.Status}).Info("process exited")
	s.publish(context.Background(), runtime.TaskExitEventTopic, &eventstypes.TaskExit{
		ContainerID: p.ContainerID(), ID: p.ID(), Pid: s.hostPid(),
		ExitStatus: e.Status, ExitedAt: timestamp(e.At),
	})
}

// predialed are stream connections dialed ahead of the process they will
// carry (predialStreams), one result per wanted stream.
type predialed [3]chan dialResult

type dialResult struct {
	conn net.Conn
	err  error
}

// predialStreams dials the agent's stream port once per wanted stream,
// concurrently.
func predialStreams(ctx context.Context, agent sandbox.AgentClient, wants []bool) predialed {
	var d predialed
	for i, want := range wants {
		if !want {
			continue
		}
		d[i] = make(chan dialResult, 1)
		go func() {
			c, err := agent.DialStream(ctx)
			d[i] <- dialResult{c, err}
		}()
	}
	return d
}

// attach attaches stream name on the i-th connection dialed ahead; when
// that failed (its dial, or the agent gave up waiting for the header) it
// opens the stream on a new connection.
func (d predialed) attach(ctx context.Context, agent sandbox.AgentClient, i int, cid, eid string, name sandbox.Stream) (net.Conn, error) {
	if r := <-d[i]; r.err == nil {
		if c, err := agent.AttachStream(ctx, r.conn, cid, eid, name); err == nil {
			return c, nil
		}
	}
	return agent.OpenStream(ctx, cid, eid, name)
}

// close drops the connections dialed ahead (the process was not created).
func (d predialed) close() {
	for _, ch := range d {
		if ch == nil {
			continue
		}
		go func() {
			if r := <-ch; r.err == nil {
				r.conn.Close()
			}
		}()
	}
}
