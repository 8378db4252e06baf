package agent

import (
	"fmt"
	"io"
	"sync/atomic"

	"github.com/cube-runtime/cube/guest-agent/protocol"
	"github.com/sirupsen/logrus"
)

// Stdio streams and their re-attachment.
//
// Each requested stream of a process is one vsock connection from the host.
// A rollback or restore resets every vsock connection (the transport reset),
// while the process runs on: its stdout pipe still fills, its stdin pipe is
// still open. So a stream outlives its connection: the host connects it again
// with a header that says "reattach" (protocol.StreamHeader.Reattach), and
// the new connection replaces the dead one.
//
//   - Output (stdout, stderr; a terminal's output): one pump per stream for
//     the process's life reads the pipe (or pty) and writes to the stream's
//     current connection. A write that fails keeps its bytes and waits for
//     the next connection (or for Delete), so nothing read from the process
//     after the reset is lost; meanwhile the process blocks once its pipe is
//     full, as it did before when the host did not read.
//   - Input (stdin): one copy per connection. A connection that ends in a
//     transport reset, or that a re-attachment replaced, leaves the process's
//     stdin open; only the host's orderly close (EOF) closes it.

// attachment is one stream's current connection.
type attachment struct {
	conn io.ReadWriteCloser
	// gen counts the connections the stream had (1 for the first).
	gen uint64
	// replaced is closed when a re-attachment replaces conn, or Delete
	// closes the streams.
	replaced chan struct{}
	// failures counts failed writes (logged once).
	failures uint32
	// ended: the process side of an output stream ended and the pump
	// half-closed this connection; a re-attachment is half-closed at once.
	ended bool
}

// resetter is a connection that knows whether it ended in a transport reset
// (resetConn; tests' fakes).
type resetter interface{ TransportReset() bool }

func wasReset(c io.ReadWriteCloser) bool {
	r, ok := c.(resetter)
	return ok && r.TransportReset()
}

// attach connects a stream connection to the process's stdio and returns
// once the copy is set up; copying continues in the background. reattach
// replaces the stream's connection when it has one.
func (p *process) attach(s protocol.Stream, conn io.ReadWriteCloser, reattach bool, log logrus.FieldLogger) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.wanted[s] {
		return errState("%s was created without %s", p.name(), s)
	}
	if p.streamsClosed {
		return errState("%s was deleted", p.name())
	}
	old := p.attached[s]
	if old != nil && !reattach {
		return errState("%s already has a %s stream", p.name(), s)
	}
	input := s == protocol.Stdin
	if input && !p.terminal && p.stdinW == nil {
		return errState("stdin of %s is closed", p.name())
	}
	if err := protocol.WriteStreamReply(conn, nil); err != nil {
		return fmt.Errorf("reply to %s stream: %w", s, err)
	}
	a := &attachment{conn: conn, gen: 1, replaced: make(chan struct{})}
	if old != nil {
		a.gen = old.gen + 1
		close(old.replaced)
		old.conn.Close()
		log.Infof("%s of %s re-attached (connection %d)", s, p.name(), a.gen)
	}
	p.attached[s] = a
	if old != nil && old.ended {
		a.ended = true
		if cw, ok := conn.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
	}
	switch {
	case input:
		copied := make(chan struct{})
		p.stdinCopied = copied
		go p.copyStdin(a, copied, log)
	case old == nil:
		src := p.stdoutR
		if p.terminal {
			src = p.pty
		} else if s == protocol.Stderr {
			src = p.stderrR
		}
		go p.pumpOutput(s, src, log)
	}
	return nil
}

// copyStdin copies one stdin connection into the process. The host's
// orderly close is EOF on stdin (pipes only; a terminal's input ends with
// CloseStdin); a reset or a replaced connection leaves stdin open for the
// next connection.
func (p *process) copyStdin(a *attachment, copied chan struct{}, log logrus.FieldLogger) {
	defer close(copied)
	p.mu.Lock()
	dst := io.Writer(p.stdinW)
	if p.terminal {
		dst = p.pty
	}
	p.mu.Unlock()
	n, err := io.Copy(dst, a.conn)
	select {
	case <-a.replaced:
		log.Debugf("stdin of %s: connection %d replaced after %d bytes", p.name(), a.gen, n)
		return
	default:
	}
	if wasReset(a.conn) {
		log.Infof("stdin of %s: connection %d reset after %d bytes; stdin stays open for the host to re-attach", p.name(), a.gen, n)
		a.conn.Close()
		return
	}
	log.WithError(err).Debugf("stdin of %s: host side ended after %d bytes", p.name(), n)
	if !p.terminal {
		p.mu.Lock()
		if p.stdinW != nil && p.attached[protocol.Stdin] == a {
			p.stdinW.Close()
			p.stdinW = nil
		}
		p.mu.Unlock()
	}
	a.conn.Close()
}

// pumpOutput copies the process's output to the stream's current
// connection until the process side ends (EOF; a pty master reads EIO once
// the last slave is closed), then half-closes it.
func (p *process) pumpOutput(s protocol.Stream, src io.Reader, log logrus.FieldLogger) {
	buf := make([]byte, 32<<10)
	var total int64
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			if !p.deliver(s, buf[:n], log) {
				log.Debugf("%s of %s: streams closed after %d bytes", s, p.name(), total)
				return
			}
			total += int64(n)
		}
		if rerr != nil {
			log.WithError(rerr).Debugf("%s of %s: process side ended after %d bytes", s, p.name(), total)
			break
		}
	}
	p.mu.Lock()
	a := p.attached[s]
	if a != nil {
		a.ended = true
	}
	p.mu.Unlock()
	if a == nil {
		return
	}
	if cw, ok := a.conn.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	a.conn.Close()
}

// deliver writes b to the stream's current connection. A write that fails
// (the connection was reset, or the host closed it) waits for the next
// connection and writes b there; false once the streams are closed (Delete).
func (p *process) deliver(s protocol.Stream, b []byte, log logrus.FieldLogger) bool {
	for {
		p.mu.Lock()
		a, closed := p.attached[s], p.streamsClosed
		p.mu.Unlock()
		if closed || a == nil {
			return false
		}
		_, err := a.conn.Write(b)
		if err == nil {
			return true
		}
		if atomic.AddUint32(&a.failures, 1) == 1 {
			log.WithError(err).Infof("%s of %s: connection %d failed; holding %d bytes until the host re-attaches", s, p.name(), a.gen, len(b))
		}
		<-a.replaced
	}
}

// closeStreams closes every stream connection and wakes pumps waiting for a
// re-attachment; the caller holds p.mu (or owns p alone).
func (p *process) closeStreams() {
	p.streamsClosed = true
	for s, a := range p.attached {
		select {
		case <-a.replaced:
		default:
			close(a.replaced)
		}
		a.conn.Close()
		delete(p.attached, s)
	}
}
