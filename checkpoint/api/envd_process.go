package api

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/containerd/errdefs"

	pb "github.com/cube-runtime/cube/checkpoint/api/envdpb/process"
)

// envd's process.Process over cube-api's commands: a process is a command of
// the sandbox (the same registry as POST /sandboxes/{id}/commands: listed,
// signalled and fed stdin by either), started as a containerd exec in the VM.

const processService = "/process.Process/"

// processService is process.Process's Connect handler.
func (s *Server) processService(opts ...connect.HandlerOption) (string, http.Handler) {
	mux := http.NewServeMux()
	mux.Handle(processService+"Start", connect.NewServerStreamHandler(processService+"Start", s.envdStart, opts...))
	mux.Handle(processService+"Connect", connect.NewServerStreamHandler(processService+"Connect", s.envdConnect, opts...))
	mux.Handle(processService+"List", connect.NewUnaryHandler(processService+"List", s.envdList, opts...))
	mux.Handle(processService+"SendInput", connect.NewUnaryHandler(processService+"SendInput", s.envdSendInput, opts...))
	mux.Handle(processService+"CloseStdin", connect.NewUnaryHandler(processService+"CloseStdin", s.envdCloseStdin, opts...))
	mux.Handle(processService+"SendSignal", connect.NewUnaryHandler(processService+"SendSignal", s.envdSendSignal, opts...))
	mux.Handle(processService+"Update", connect.NewUnaryHandler(processService+"Update",
		func(context.Context, *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
			return nil, fmt.Errorf("process.Process/Update resizes a PTY: cube-api runs commands without a PTY: %w", errdefs.ErrNotImplemented)
		}, opts...))
	mux.Handle(processService+"StreamInput", connect.NewClientStreamHandler(processService+"StreamInput",
		func(context.Context, *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
			return nil, fmt.Errorf("process.Process/StreamInput is not served by cube-api: send stdin with SendInput: %w", errdefs.ErrNotImplemented)
		}, opts...))
	return processService, mux
}

// bashFallback: E2B's SDK runs every command line as `/bin/bash -l -c LINE`;
// in a sandbox without /bin/bash (busybox, alpine) it runs with /bin/sh.
func (s *Server) bashFallback(ctx context.Context, id, cmd string) string {
	if cmd != "/bin/bash" {
		return cmd
	}
	if _, err := s.be.Stat(ctx, id, "/bin/bash"); errdefs.IsNotFound(err) {
		if _, err := s.be.Stat(ctx, id, "/bin/sh"); err == nil {
			return "/bin/sh"
		}
	}
	return cmd
}

func (s *Server) envdStart(ctx context.Context, req *connect.Request[pb.StartRequest], out *connect.ServerStream[pb.StartResponse]) error {
	call, err := envdCallOf(ctx)
	if err != nil {
		return err
	}
	m := req.Msg
	if m.Pty != nil {
		return fmt.Errorf("field \"pty\": cube-api runs commands without a PTY (E2B's sandbox.pty is not served): %w", errdefs.ErrNotImplemented)
	}
	cfg := m.GetProcess()
	if cfg == nil || cfg.Cmd == "" {
		return invalid("field \"process.cmd\" is required")
	}
	cr := CommandRequest{Cmd: s.bashFallback(ctx, call.sandbox, cfg.Cmd), Args: cfg.Args, Envs: cfg.Envs,
		Cwd: cfg.GetCwd(), User: call.user, Stdin: m.GetStdin()}
	c, err := s.startCommand(ctx, call.sandbox, cr, m.GetTag())
	if err != nil {
		return err
	}
	c.info.Cmd = cfg.Cmd // listed as asked
	return s.envdStream(ctx, req.Header(), c, func(ev *pb.ProcessEvent) error {
		return out.Send(&pb.StartResponse{Event: ev})
	})
}

// envdStream sends c's events (start, data, end) until its end, the client
// leaving (the process runs on) or its Connect deadline (the process is
// killed: E2B's timeoutMs). A keepalive is sent every Keepalive-Ping-Interval
// seconds when the client asks for them.
func (s *Server) envdStream(ctx context.Context, h http.Header, c *command, send func(*pb.ProcessEvent) error) error {
	defer c.detach()
	c.mu.Lock()
	sub := c.sub
	c.mu.Unlock()
	if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: c.info.Pid}}}); err != nil {
		return nil // the client left
	}
	var tick <-chan time.Time
	if sec, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval")); err == nil && sec > 0 {
		t := time.NewTicker(time.Duration(min(sec, 3600)) * time.Second)
		defer t.Stop()
		tick = t.C
	}
	for {
		var ev *pb.ProcessEvent
		select {
		case e := <-sub:
			ev = processEvent(e)
		case <-tick:
			ev = &pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded {
				_ = c.proc.Kill(context.WithoutCancel(ctx), syscall.SIGKILL)
				return fmt.Errorf("process %d: the call's timeout passed: killed: %w", c.info.Pid, context.DeadlineExceeded)
			}
			return nil
		case <-s.stop:
			return fmt.Errorf("cube-api is shutting down (process %d runs on: Connect to it again): %w", c.info.Pid, errdefs.ErrUnavailable)
		}
		if err := send(ev); err != nil {
			return nil // the client left
		}
		if _, end := ev.Event.(*pb.ProcessEvent_End); end {
			return nil
		}
	}
}

// processEvent is a command's event in envd's form.
func processEvent(e Event) *pb.ProcessEvent {
	switch e.Type {
	case "stdout":
		return &pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stdout{Stdout: []byte(e.Data)}}}}
	case "stderr":
		return &pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stderr{Stderr: []byte(e.Data)}}}}
	case "exit":
		code := 0
		if e.ExitCode != nil {
			code = *e.ExitCode
		}
		return &pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: &pb.ProcessEvent_EndEvent{ExitCode: int32(code), Exited: true, Status: fmt.Sprintf("exit status %d", code)}}}
	}
	msg := e.Error
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: &pb.ProcessEvent_EndEvent{ExitCode: -1, Status: "error", Error: &msg}}}
}

// selected is the command a ProcessSelector names in the call's sandbox.
func (s *Server) selected(ctx context.Context, sel *pb.ProcessSelector) (string, *command, error) {
	call, err := envdCallOf(ctx)
	if err != nil {
		return "", nil, err
	}
	switch v := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		c, err := s.command(ctx, call.sandbox, strconv.FormatUint(uint64(v.Pid), 10))
		return call.sandbox, c, err
	case *pb.ProcessSelector_Tag:
		s.cmds.mu.Lock()
		defer s.cmds.mu.Unlock()
		for _, c := range s.cmds.m[call.sandbox] {
			if c.tag != "" && c.tag == v.Tag {
				return call.sandbox, c, nil
			}
		}
		return "", nil, fmt.Errorf("no running process with tag %q in sandbox %s: %w", v.Tag, call.sandbox, errdefs.ErrNotFound)
	}
	return "", nil, invalid("field \"process\": a pid or a tag is required")
}

func (s *Server) envdConnect(ctx context.Context, req *connect.Request[pb.ConnectRequest], out *connect.ServerStream[pb.ConnectResponse]) error {
	_, c, err := s.selected(ctx, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	if c.adopted {
		return fmt.Errorf("process %d came back with a rollback (or from before a restart of cube-api): its output is not connected: %w", c.info.Pid, errdefs.ErrFailedPrecondition)
	}
	c.mu.Lock()
	if c.sub != nil {
		c.mu.Unlock()
		return fmt.Errorf("process %d already has a client streaming its output: %w", c.info.Pid, errdefs.ErrFailedPrecondition)
	}
	c.sub, c.subGone = make(chan Event), make(chan struct{})
	c.mu.Unlock()
	return s.envdStream(ctx, req.Header(), c, func(ev *pb.ProcessEvent) error {
		return out.Send(&pb.ConnectResponse{Event: ev})
	})
}

func (s *Server) envdList(ctx context.Context, req *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	call, err := envdCallOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.runningSandbox(ctx, call.sandbox); err != nil {
		return nil, err
	}
	if err := s.syncCommands(ctx, call.sandbox); err != nil {
		logOfCtx(ctx).WithError(err).WithField("sandbox", call.sandbox).Warn("envd List: the guest's processes (the list shows those cube-api waits for)")
	}
	res := &pb.ListResponse{}
	s.cmds.mu.Lock()
	for _, info := range s.cmds.listLocked(call.sandbox) {
		c := s.cmds.m[call.sandbox][info.Pid]
		p := &pb.ProcessInfo{Pid: info.Pid, Config: &pb.ProcessConfig{Cmd: info.Cmd, Args: info.Args, Envs: c.envs}}
		if info.Cwd != "" {
			p.Config.Cwd = &info.Cwd
		}
		if c.tag != "" {
			p.Tag = &c.tag
		}
		res.Processes = append(res.Processes, p)
	}
	s.cmds.mu.Unlock()
	return connect.NewResponse(res), nil
}

func (s *Server) envdSendInput(ctx context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	_, c, err := s.selected(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	in, ok := req.Msg.GetInput().GetInput().(*pb.ProcessInput_Stdin)
	if !ok {
		return nil, invalid("field \"input.stdin\" is required (cube-api has no PTY: \"input.pty\" is not served)")
	}
	if c.stdin == nil {
		return nil, fmt.Errorf("process %d was started without stdin (E2B: stdin: true): %w", c.info.Pid, errdefs.ErrFailedPrecondition)
	}
	if _, err := c.stdin.Write(in.Stdin); err != nil {
		return nil, fmt.Errorf("process %d's stdin: %v: %w", c.info.Pid, err, errdefs.ErrFailedPrecondition)
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func (s *Server) envdCloseStdin(ctx context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	_, c, err := s.selected(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if c.stdin == nil {
		return nil, fmt.Errorf("process %d was started without stdin (E2B: stdin: true): %w", c.info.Pid, errdefs.ErrFailedPrecondition)
	}
	c.stdin.Close()
	if err := c.proc.CloseStdin(ctx); err != nil && !errdefs.IsNotFound(err) {
		return nil, err
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

func (s *Server) envdSendSignal(ctx context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case pb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, invalid("field \"signal\": %v is not SIGNAL_SIGKILL or SIGNAL_SIGTERM", req.Msg.GetSignal())
	}
	_, c, err := s.selected(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := c.proc.Kill(ctx, sig); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}
