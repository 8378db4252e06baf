package agent

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/ttrpc"
	"github.com/cube-runtime/cube/guest-agent/protocol"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// Listen opens a listener (a vsock port in the guest, a Unix socket in
// tests). Serve calls it again whenever a listener fails, so a transport
// that broke under a VM restore is replaced, not fatal.
type Listen func() (net.Listener, error)

// Serve runs the ttrpc service and the stdio stream server until ctx ends.
func (s *Service) Serve(ctx context.Context, agent, streams Listen) error {
	srv, err := ttrpc.NewServer()
	if err != nil {
		return err
	}
	s.Register(srv)
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	errc := make(chan error, 2)
	go func() {
		errc <- s.serveLoop(ctx, "agent", agent, func(l net.Listener) error { return srv.Serve(ctx, l) })
	}()
	go func() {
		errc <- s.serveLoop(ctx, "stream", streams, func(l net.Listener) error { return s.serveStreams(ctx, l) })
	}()
	err = <-errc
	<-errc
	return err
}

func (s *Service) serveLoop(ctx context.Context, name string, listen Listen, serve func(net.Listener) error) error {
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		l, err := listen()
		if err != nil {
			s.log.WithError(err).Errorf("%s listener; retrying in %v", name, backoff)
		} else {
			backoff = 10 * time.Millisecond
			err = serve(&resetListener{Listener: l, onReset: s.NoteTransportReset})
			l.Close()
			if ctx.Err() != nil || errors.Is(err, ttrpc.ErrServerClosed) {
				return nil
			}
			s.log.WithError(err).Warnf("%s listener failed; listening again", name)
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
	return nil
}

func (s *Service) serveStreams(ctx context.Context, l net.Listener) error {
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		go s.handleStream(conn)
	}
}

// streamHeaderTimeout bounds how long a connection may take to say which
// stream it is; it is a guard against idle peers, not a tuning knob.
const streamHeaderTimeout = 10 * time.Second

func (s *Service) handleStream(conn net.Conn) {
	conn.SetReadDeadline(time.Now().Add(streamHeaderTimeout))
	h, err := protocol.ReadStreamHeader(conn)
	conn.SetReadDeadline(time.Time{})
	if err != nil {
		protocol.WriteStreamReply(conn, err)
		conn.Close()
		return
	}
	_, p, err := s.lookup(h.ContainerID, h.ExecID)
	if err == nil {
		err = p.attach(h.Stream, conn, h.Reattach, s.log.WithFields(logrus.Fields{"stream": h.Stream}))
	}
	if err != nil {
		s.log.WithError(err).WithFields(logrus.Fields{"container": h.ContainerID, "exec": h.ExecID, "stream": h.Stream}).Warn("stream refused")
		protocol.WriteStreamReply(conn, err)
		conn.Close()
	}
}

// resetListener reports connections that end in a reset: the guest's only
// sign of a vsock transport reset (VM snapshot restore or rollback). Linux's
// virtio-vsock handles VIRTIO_VSOCK_EVENT_TRANSPORT_RESET by moving every
// connected socket to TCP_CLOSE with sk_err = ECONNRESET; a blocked read then
// wakes and recvmsg returns ENOTCONN, which github.com/mdlayher/vsock turns
// into io.EOF. So whatever the error, the socket's pending SO_ERROR decides:
// ECONNRESET there is a reset, a peer's orderly close or RST leaves it 0.
type resetListener struct {
	net.Listener
	onReset func()
}

func (l *resetListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &resetConn{Conn: c, onReset: l.onReset}, nil
}

type resetConn struct {
	net.Conn
	onReset func()
	reset   atomic.Bool
}

func (c *resetConn) check(err error) {
	if err == nil {
		return
	}
	if errors.Is(err, unix.ECONNRESET) || errors.Is(err, unix.ENOTCONN) || errors.Is(soError(c.Conn), unix.ECONNRESET) {
		c.reset.Store(true)
		c.onReset()
	}
}

// TransportReset says whether the connection ended in a transport reset
// (streams.go: a reset stdin stays open for the host to re-attach).
func (c *resetConn) TransportReset() bool { return c.reset.Load() }

// soError returns (and clears) the socket's pending error, nil when there is
// none or the connection has no file descriptor.
func soError(c net.Conn) error {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	var e int
	if cerr := rc.Control(func(fd uintptr) { e, err = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR) }); cerr != nil || err != nil || e == 0 {
		return nil
	}
	return unix.Errno(e)
}

func (c *resetConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.check(err)
	return n, err
}

func (c *resetConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.check(err)
	return n, err
}

// CloseWrite half-closes when the transport supports it (vsock, Unix).
func (c *resetConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
