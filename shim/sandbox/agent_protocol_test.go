package sandbox

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/ttrpc"

	"github.com/cube-runtime/cube/guest-agent/protocol"
	"github.com/cube-runtime/cube/hypervisor/vsockdial"
)

// stubAgentService answers the RPCs the adapter test calls (the embedded nil
// interface satisfies the rest; calling one of those would panic).
type stubAgentService struct {
	protocol.AgentService
	created *protocol.CreateContainerRequest
}

func (s *stubAgentService) Health(ctx context.Context, _ *protocol.HealthRequest) (*protocol.HealthResponse, error) {
	return &protocol.HealthResponse{Ok: true}, nil
}

func (s *stubAgentService) MountDisk(ctx context.Context, r *protocol.MountDiskRequest) (*protocol.MountDiskResponse, error) {
	return &protocol.MountDiskResponse{MountPoint: "/run/cube/disks/" + r.GetSerial(), Device: "/dev/vda", Timing: "settle=1.0 mount=2.0"}, nil
}

func (s *stubAgentService) CreateContainer(ctx context.Context, r *protocol.CreateContainerRequest) (*protocol.CreateContainerResponse, error) {
	s.created = r
	return &protocol.CreateContainerResponse{Pid: 42, Timing: "cgroup=1.0 prepare=2.0"}, nil
}

func (s *stubAgentService) Wait(ctx context.Context, r *protocol.WaitRequest) (*protocol.WaitResponse, error) {
	return &protocol.WaitResponse{ExitStatus: 143, Signal: 15, ExitedAtUnixNano: 1e9}, nil
}

// chanListener hands the ttrpc server the connections the fake VMM routed
// to the agent port.
type chanListener struct {
	conns chan net.Conn
	done  chan struct{}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}
func (l *chanListener) Close() error   { return nil }
func (l *chanListener) Addr() net.Addr { return &net.UnixAddr{Name: "agent", Net: "unix"} }

// vsockOnlyVMM is a VMM whose only working method is DialVsock.
type vsockOnlyVMM struct {
	VMM
	path string
}

func (v vsockOnlyVMM) DialVsock(ctx context.Context, port uint32) (net.Conn, error) {
	return vsockdial.Dial(ctx, v.path, port)
}

// TestProtocolAdapter runs the generated ttrpc client against the generated
// server behind a fake hybrid vsock socket, and a stdio stream with the
// protocol's header, to check the adapter's field mapping end to end.
func TestProtocolAdapter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	agentConns := &chanListener{conns: make(chan net.Conn), done: make(chan struct{})}
	defer close(agentConns.done)
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	stub := &stubAgentService{}
	protocol.RegisterAgentService(srv, stub)
	go srv.Serve(context.Background(), agentConns)
	defer srv.Close()
	headers := make(chan protocol.StreamHeader, 1)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				r := bufio.NewReader(c)
				line, err := r.ReadString('\n')
				if err != nil {
					c.Close()
					return
				}
				port := strings.TrimSpace(strings.TrimPrefix(line, "CONNECT "))
				fmt.Fprintf(c, "OK 7\n")
				switch port {
				case fmt.Sprint(protocol.AgentPort):
					agentConns.conns <- c
				case fmt.Sprint(protocol.StreamPort):
					defer c.Close()
					h, err := protocol.ReadStreamHeader(r)
					protocol.WriteStreamReply(c, err)
					if err == nil {
						headers <- h
						io.WriteString(c, "stream data")
					}
				default:
					c.Close()
				}
			}()
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	vmm := vsockOnlyVMM{path: path}
	a, err := DialAgent(ctx, vmm)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.Health(ctx); err != nil {
		t.Fatal(err)
	}
	md, err := a.MountDisk(ctx, MountDiskRequest{Serial: "cube-slot-0", FSType: "ext4"})
	mp := md.MountPoint
	if err != nil || mp != "/run/cube/disks/cube-slot-0" || md.Timing != "settle=1.0 mount=2.0" {
		t.Fatalf("mount %+v %v", md, err)
	}
	created, err := a.CreateContainer(ctx, CreateContainerRequest{ContainerID: "c1", Spec: []byte(`{"ociVersion":"1.0.2"}`),
		Rootfs: mp, Stdio: StdioFlags{Stdout: true}})
	if err != nil || created.Pid != 42 || created.Timing != "cgroup=1.0 prepare=2.0" {
		t.Fatalf("create %+v %v", created, err)
	}
	if c := stub.created; c.GetContainerId() != "c1" || c.GetRootfs() != mp || !c.GetStdio().GetStdout() || c.GetStdio().GetStdin() || string(c.GetSpec()) != `{"ociVersion":"1.0.2"}` {
		t.Fatalf("agent got %v", c)
	}
	st, err := a.Wait(ctx, "c1", "")
	if err != nil || st.Status != 143 || st.Signal != 15 || st.ExitedAt.Unix() != 1 {
		t.Fatalf("wait %+v %v", st, err)
	}
	conn, err := a.OpenStream(ctx, "c1", "", Stdout)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(conn)
	if string(b) != "stream data" {
		t.Fatalf("stream %q", b)
	}
	if h := <-headers; h.ContainerID != "c1" || h.ExecID != "" || h.Stream != protocol.Stdout {
		t.Fatalf("header %+v", h)
	}
}

func TestTreeKindsMatchTheProtocol(t *testing.T) {
	for k, p := range map[TreeKind]protocol.TreeEntry_Kind{TreeDir: protocol.TreeEntry_DIR, TreeFile: protocol.TreeEntry_FILE, TreeSymlink: protocol.TreeEntry_SYMLINK} {
		if protocol.TreeEntry_Kind(k) != p {
			t.Errorf("%v = %d, the protocol's %v = %d", k, k, p, p)
		}
	}
}
