package sandboxtest

import (
	"context"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/shim/sandbox"
)

// OpenStream attaches one stdio stream: a socket pair whose guest end the
// process's script reads or writes.
func (a *Agent) OpenStream(ctx context.Context, cid, eid string, s sandbox.Stream) (net.Conn, error) {
	return a.openStream(cid, eid, s, false)
}

// DialStream returns a placeholder connection for AttachStream.
func (a *Agent) DialStream(ctx context.Context) (net.Conn, error) {
	if err := a.enter("DialStream"); err != nil {
		return nil, err
	}
	a.mu.Lock()
	err := a.DialStreamErr
	a.mu.Unlock()
	if err != nil {
		return nil, err
	}
	c, _ := net.Pipe()
	return c, nil
}

// AttachStream closes the placeholder and is OpenStream.
func (a *Agent) AttachStream(ctx context.Context, conn net.Conn, cid, eid string, s sandbox.Stream) (net.Conn, error) {
	conn.Close()
	return a.openStream(cid, eid, s, false)
}

// ReattachStream is OpenStream replacing the stream's connection.
func (a *Agent) ReattachStream(ctx context.Context, cid, eid string, s sandbox.Stream) (net.Conn, error) {
	return a.openStream(cid, eid, s, true)
}

func (a *Agent) openStream(cid, eid string, s sandbox.Stream, reattach bool) (net.Conn, error) {
	name := "OpenStream"
	if reattach {
		name = "ReattachStream"
	}
	if err := a.enter(name); err != nil {
		return nil, err
	}
	p, err := a.lookup(cid, eid)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	want := map[sandbox.Stream]bool{sandbox.Stdin: p.want.Stdin, sandbox.Stdout: p.want.Stdout, sandbox.Stderr: p.want.Stderr}[s]
	if !want {
		return nil, fmt.Errorf("process %s/%s has no %s", cid, eid, s)
	}
	if old := p.guest[s]; old != nil && !reattach {
		return nil, fmt.Errorf("process %s/%s: %s already attached", cid, eid, s)
	} else if old != nil {
		old.Close()
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	host := os.NewFile(uintptr(fds[0]), "host")
	defer host.Close()
	conn, err := net.FileConn(host)
	if err != nil {
		unix.Close(fds[1])
		return nil, err
	}
	p.guest[s] = os.NewFile(uintptr(fds[1]), string(s))
	return conn, nil
}
