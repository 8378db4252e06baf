package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"
	"github.com/cube-runtime/cube/guest-agent/protocol"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DialAgent is the production AgentDialer: ttrpc over vsock AgentPort, calls unbounded but by their ctx.
func DialAgent(ctx context.Context, vmm VMM) (AgentClient, error) { return dialAgent(ctx, vmm, 0) }

// DialAgentTimeout is DialAgent with every call but Wait (which lasts as long as the process) bounded by
// timeout, so a guest that stopped answering fails the request with a reason instead of hanging it.
func DialAgentTimeout(timeout time.Duration) AgentDialer {
	return func(ctx context.Context, vmm VMM) (AgentClient, error) { return dialAgent(ctx, vmm, timeout) }
}

func dialAgent(ctx context.Context, vmm VMM, timeout time.Duration) (AgentClient, error) {
	conn, err := vmm.DialVsock(ctx, protocol.AgentPort)
	if err != nil {
		return nil, err
	}
	var opts []ttrpc.ClientOpts
	if timeout > 0 {
		opts = append(opts, ttrpc.WithUnaryClientInterceptor(callDeadline(timeout)))
	}
	tc := ttrpc.NewClient(conn, opts...)
	return &protocolAgent{vmm: vmm, tc: tc, c: protocol.NewAgentClient(tc)}, nil
}

// waitMethod is the one agent call that may rightly take longer than any bound.
const waitMethod = "/cube.agent.v1.Agent/Wait"

// callDeadline bounds each agent call but Wait by timeout; a call that runs out says which one and why.
func callDeadline(timeout time.Duration) ttrpc.UnaryClientInterceptor {
	return func(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response, info *ttrpc.UnaryClientInfo, invoke ttrpc.Invoker) error {
		if info.FullMethod == waitMethod {
			return invoke(ctx, req, resp)
		}
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		err := invoke(cctx, req, resp)
		if err != nil && ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("guest agent: %s got no answer within %s (shim config agent_timeout): the guest may have stalled; its console log is in the sandbox's state directory: %w: %w",
				strings.TrimPrefix(info.FullMethod, "/cube.agent.v1.Agent/"), timeout, errdefs.ErrUnavailable, context.DeadlineExceeded)
		}
		return err
	}
}

type protocolAgent struct {
	vmm VMM
	tc  *ttrpc.Client
	c   protocol.AgentService
}

func (a *protocolAgent) Health(ctx context.Context) error {
	r, err := a.c.Health(ctx, &protocol.HealthRequest{})
	if err != nil {
		return err
	}
	if !r.GetOk() {
		return fmt.Errorf("agent reports not healthy")
	}
	return nil
}

func (a *protocolAgent) MountDisk(ctx context.Context, req MountDiskRequest) (MountedDisk, error) {
	r, err := a.c.MountDisk(ctx, &protocol.MountDiskRequest{
		Serial: req.Serial, MountPoint: req.MountPoint, FsType: req.FSType,
		Options: req.Options, ReadOnly: req.ReadOnly,
	})
	if err != nil {
		return MountedDisk{}, err
	}
	return MountedDisk{MountPoint: r.GetMountPoint(), Timing: r.GetTiming()}, nil
}

func (a *protocolAgent) Freshen(ctx context.Context, req FreshenRequest) (MountedDisk, error) {
	pr := &protocol.FreshenRequest{UnixNano: req.Time.UnixNano(), Entropy: req.Entropy}
	if m := req.Mount; m != nil {
		pr.Mount = &protocol.MountDiskRequest{Serial: m.Serial, MountPoint: m.MountPoint, FsType: m.FSType, Options: m.Options, ReadOnly: m.ReadOnly}
	}
	r, err := a.c.Freshen(ctx, pr)
	if status.Code(err) == codes.Unimplemented {
		return MountedDisk{}, fmt.Errorf("the guest agent predates Freshen: %w", errdefs.ErrNotImplemented)
	}
	if err != nil {
		return MountedDisk{}, err
	}
	m := r.GetMount()
	return MountedDisk{MountPoint: m.GetMountPoint(), Timing: m.GetTiming()}, nil
}

func (a *protocolAgent) UnmountDisk(ctx context.Context, mp string) error {
	_, err := a.c.UnmountDisk(ctx, &protocol.UnmountDiskRequest{MountPoint: mp})
	return err
}

func (a *protocolAgent) BlockDevice(ctx context.Context, serial string, size uint64) (GuestBlockDevice, error) {
	r, err := a.c.BlockDevice(ctx, &protocol.BlockDeviceRequest{Serial: serial, SizeBytes: size})
	if status.Code(err) == codes.Unimplemented {
		return GuestBlockDevice{}, fmt.Errorf("the guest agent in the sandbox's initrd (shim config initrd) predates raw block volumes (it has no BlockDevice call): rebuild the initrd with this release's cube-agent: %w", errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return GuestBlockDevice{}, err
	}
	return GuestBlockDevice{Device: r.GetDevice(), Major: r.GetMajor(), Minor: r.GetMinor(), Size: r.GetSizeBytes()}, nil
}

func stdio(f StdioFlags) *protocol.Stdio {
	return &protocol.Stdio{Stdin: f.Stdin, Stdout: f.Stdout, Stderr: f.Stderr}
}

func (a *protocolAgent) CreateContainer(ctx context.Context, req CreateContainerRequest) (CreatedContainer, error) {
	r, err := a.c.CreateContainer(ctx, &protocol.CreateContainerRequest{
		ContainerId: req.ContainerID, Spec: req.Spec, Rootfs: req.Rootfs, Stdio: stdio(req.Stdio),
	})
	if err != nil {
		return CreatedContainer{}, err
	}
	return CreatedContainer{Pid: r.GetPid(), Timing: r.GetTiming()}, nil
}

func (a *protocolAgent) PrepareSpare(ctx context.Context) (string, error) {
	r, err := a.c.PrepareSpare(ctx, &protocol.PrepareSpareRequest{})
	if status.Code(err) == codes.Unimplemented {
		return "", fmt.Errorf("the guest agent in the initrd predates spare container helpers (it has no PrepareSpare call): %w", errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return "", err
	}
	return r.GetTiming(), nil
}

func (a *protocolAgent) ExecProcess(ctx context.Context, req ExecProcessRequest) (uint32, error) {
	r, err := a.c.ExecProcess(ctx, &protocol.ExecProcessRequest{
		ContainerId: req.ContainerID, ExecId: req.ExecID, Process: req.Process, Stdio: stdio(req.Stdio),
	})
	if err != nil {
		return 0, err
	}
	return r.GetPid(), nil
}

func (a *protocolAgent) Start(ctx context.Context, cid, eid string) (uint32, string, error) {
	r, err := a.c.Start(ctx, &protocol.StartRequest{ContainerId: cid, ExecId: eid})
	if err != nil {
		return 0, "", err
	}
	return r.GetPid(), r.GetTiming(), nil
}

func (a *protocolAgent) Signal(ctx context.Context, cid, eid string, sig uint32, all bool) error {
	_, err := a.c.Signal(ctx, &protocol.SignalRequest{ContainerId: cid, ExecId: eid, Signal: sig, All: all})
	return err
}

func (a *protocolAgent) Wait(ctx context.Context, cid, eid string) (ExitStatus, error) {
	r, err := a.c.Wait(ctx, &protocol.WaitRequest{ContainerId: cid, ExecId: eid})
	if err != nil {
		return ExitStatus{}, err
	}
	return ExitStatus{Status: r.GetExitStatus(), Signal: r.GetSignal(), ExitedAt: time.Unix(0, r.GetExitedAtUnixNano())}, nil
}

func (a *protocolAgent) CloseStdin(ctx context.Context, cid, eid string) error {
	_, err := a.c.CloseStdin(ctx, &protocol.CloseStdinRequest{ContainerId: cid, ExecId: eid})
	return err
}

func (a *protocolAgent) ResizePty(ctx context.Context, cid, eid string, w, h uint32) error {
	_, err := a.c.ResizePty(ctx, &protocol.ResizePtyRequest{ContainerId: cid, ExecId: eid, Width: w, Height: h})
	return err
}

func (a *protocolAgent) ListPids(ctx context.Context, cid string) ([]uint32, error) {
	r, err := a.c.ListPids(ctx, &protocol.ListPidsRequest{ContainerId: cid})
	if err != nil {
		return nil, err
	}
	return r.GetPids(), nil
}

func (a *protocolAgent) Delete(ctx context.Context, cid, eid string, force bool) (ExitStatus, error) {
	r, err := a.c.Delete(ctx, &protocol.DeleteRequest{ContainerId: cid, ExecId: eid, Force: force})
	if err != nil {
		return ExitStatus{}, err
	}
	return ExitStatus{Status: r.GetExitStatus(), ExitedAt: time.Unix(0, r.GetExitedAtUnixNano())}, nil
}

func (a *protocolAgent) SyncFilesystems(ctx context.Context) error {
	_, err := a.c.SyncFilesystems(ctx, &protocol.Empty{})
	return err
}

func (a *protocolAgent) FreezeFilesystems(ctx context.Context) error {
	_, err := a.c.FreezeFilesystems(ctx, &protocol.FreezeRequest{})
	return err
}

func (a *protocolAgent) ThawFilesystems(ctx context.Context) error {
	_, err := a.c.ThawFilesystems(ctx, &protocol.ThawRequest{})
	return err
}

func (a *protocolAgent) SetTime(ctx context.Context, t time.Time) error {
	_, err := a.c.SetTime(ctx, &protocol.SetTimeRequest{UnixNano: t.UnixNano()})
	return err
}

func (a *protocolAgent) ReseedRandom(ctx context.Context, entropy []byte) error {
	_, err := a.c.ReseedRandom(ctx, &protocol.ReseedRandomRequest{Entropy: entropy})
	return err
}

func (a *protocolAgent) PowerOff(ctx context.Context) error {
	_, err := a.c.PowerOff(ctx, &protocol.PowerOffRequest{})
	return err
}

func (a *protocolAgent) WriteFile(ctx context.Context, path string, data []byte, mode uint32) error {
	// The agent takes at most MaxFileChunk bytes per request: the first
	// request truncates, the rest append.
	for off := 0; ; {
		n := min(len(data)-off, protocol.MaxFileChunk)
		if _, err := a.c.WriteFile(ctx, &protocol.WriteFileRequest{Path: path, Data: data[off : off+n], Mode: mode,
			Append: off > 0, MakeParents: true}); err != nil {
			return err
		}
		if off += n; off >= len(data) {
			return nil
		}
	}
}

func (a *protocolAgent) ReadFile(ctx context.Context, path string, max int) ([]byte, error) {
	var out []byte
	for len(out) < max {
		n := min(max-len(out), protocol.MaxFileChunk)
		r, err := a.c.ReadFile(ctx, &protocol.ReadFileRequest{Path: path, Offset: int64(len(out)), Length: uint32(n)})
		if err != nil {
			return nil, err
		}
		out = append(out, r.GetData()...)
		if r.GetEof() || len(r.GetData()) == 0 {
			break
		}
	}
	return out, nil
}

func (a *protocolAgent) SyncTree(ctx context.Context, dir string, t Tree) (TreeResult, error) {
	req := &protocol.SyncTreeRequest{Dir: dir, Mode: t.Mode, Uid: t.UID, Gid: t.GID,
		Entries: make([]*protocol.TreeEntry, 0, len(t.Entries))}
	for _, e := range t.Entries {
		req.Entries = append(req.Entries, &protocol.TreeEntry{Path: e.Path, Kind: protocol.TreeEntry_Kind(e.Kind),
			Mode: e.Mode, Uid: e.UID, Gid: e.GID, Data: e.Data, Target: e.Target})
	}
	r, err := a.c.SyncTree(ctx, req)
	if err != nil {
		return TreeResult{}, err
	}
	return TreeResult{Written: r.GetWritten(), Removed: r.GetRemoved()}, nil
}

func (a *protocolAgent) PrepareVolume(ctx context.Context, req VolumeRequest) error {
	_, err := a.c.PrepareVolume(ctx, &protocol.PrepareVolumeRequest{Path: req.Path, Mode: req.Mode,
		Tmpfs: req.Tmpfs, TmpfsSizeBytes: req.TmpfsSize, VirtiofsTag: req.VirtiofsTag})
	return err
}

func (a *protocolAgent) ListProcesses(ctx context.Context) ([]GuestProcess, error) {
	r, err := a.c.ListProcesses(ctx, &protocol.ListProcessesRequest{})
	if err != nil {
		return nil, err
	}
	out := make([]GuestProcess, 0, len(r.GetProcesses()))
	for _, p := range r.GetProcesses() {
		g := GuestProcess{ContainerID: p.GetContainerId(), ExecID: p.GetExecId(), Pid: p.GetPid(), Status: p.GetStatus(),
			Stdio:    StdioFlags{Stdin: p.GetStdio().GetStdin(), Stdout: p.GetStdio().GetStdout(), Stderr: p.GetStdio().GetStderr()},
			Terminal: p.GetTerminal()}
		if g.Status == GuestStopped {
			g.Exit = ExitStatus{Status: p.GetExitStatus(), ExitedAt: time.Unix(0, p.GetExitedAtUnixNano())}
		}
		out = append(out, g)
	}
	return out, nil
}

func (a *protocolAgent) RenameContainer(ctx context.Context, cid, newID string) error {
	_, err := a.c.RenameContainer(ctx, &protocol.RenameContainerRequest{ContainerId: cid, NewId: newID})
	return err
}

func (a *protocolAgent) OpenStream(ctx context.Context, cid, eid string, s Stream) (net.Conn, error) {
	return a.openStream(ctx, protocol.StreamHeader{ContainerID: cid, ExecID: eid, Stream: protocol.Stream(s)})
}

func (a *protocolAgent) ReattachStream(ctx context.Context, cid, eid string, s Stream) (net.Conn, error) {
	return a.openStream(ctx, protocol.StreamHeader{ContainerID: cid, ExecID: eid, Stream: protocol.Stream(s), Reattach: true})
}

func (a *protocolAgent) DialStream(ctx context.Context) (net.Conn, error) {
	return a.vmm.DialVsock(ctx, protocol.StreamPort)
}

func (a *protocolAgent) AttachStream(ctx context.Context, conn net.Conn, cid, eid string, s Stream) (net.Conn, error) {
	return attachStream(ctx, conn, protocol.StreamHeader{ContainerID: cid, ExecID: eid, Stream: protocol.Stream(s)})
}

func (a *protocolAgent) openStream(ctx context.Context, h protocol.StreamHeader) (net.Conn, error) {
	conn, err := a.DialStream(ctx)
	if err != nil {
		return nil, err
	}
	return attachStream(ctx, conn, h)
}

// attachStream sends the stream header on conn and reads the agent's
// answer; conn is closed on error.
func attachStream(ctx context.Context, conn net.Conn, h protocol.StreamHeader) (net.Conn, error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if err := protocol.OpenStream(conn, h); err != nil {
		conn.Close()
		return nil, fmt.Errorf("open %s stream of %s/%s: %w", h.Stream, h.ContainerID, h.ExecID, err)
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, nil
}

func (a *protocolAgent) Close() error { return a.tc.Close() }
