// Package vsockdial is the host side of the hybrid vsock handshake that
// hypervisor/virtio/vsock serves: connect to the device's Unix socket, write
// "CONNECT <port>\n", read "OK <hostport>\n"; the connection then carries the
// guest stream. It is a leaf (the standard library only), so that a client
// such as the shim dials a guest port without linking any device emulation.
package vsockdial

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// maxReply bounds the device's "OK <hostport>\n" reply; a peer that sends more without a newline is broken.
const maxReply = 64

// Dial is the host side of the hybrid scheme this device serves: connect to the device's Unix socket, write
// "CONNECT <port>\n", read "OK <hostport>\n". The returned connection then carries the guest stream.
func Dial(ctx context.Context, udsPath string, port uint32) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", udsPath)
	if err != nil {
		return nil, fmt.Errorf("dial vsock port %d: %w", port, err)
	}
	// The handshake must not outlive ctx; the deadline is cleared afterwards so the stream itself has none.
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	err = handshake(conn, port)
	if !stop() {
		err = fmt.Errorf("vsock port %d handshake: %w", port, ctx.Err())
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	return conn, nil
}

func handshake(conn net.Conn, port uint32) error {
	if _, err := fmt.Fprintf(conn, "CONNECT %d\n", port); err != nil {
		return fmt.Errorf("vsock port %d: write CONNECT: %w", port, err)
	}
	// Byte by byte: whatever follows the newline already belongs to the guest stream.
	var line []byte
	var b [1]byte
	for {
		n, err := conn.Read(b[:])
		if n == 1 {
			if b[0] == '\n' {
				break
			}
			line = append(line, b[0])
			if len(line) > maxReply {
				return fmt.Errorf("vsock port %d: handshake reply longer than %d bytes", port, maxReply)
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("vsock port %d: read handshake reply (got %q): %w", port, line, err)
		}
	}
	if _, err := ParseReply(string(line)); err != nil {
		return fmt.Errorf("vsock port %d: %w", port, err)
	}
	return nil
}

// ParseReply parses the device's handshake reply line (without newline) and returns the host port it names.
func ParseReply(line string) (uint32, error) {
	rest, ok := strings.CutPrefix(line, "OK ")
	if !ok {
		if len(line) > maxReply {
			line = line[:maxReply]
		}
		return 0, fmt.Errorf("vsock handshake refused: %q (is the guest listening on that port?)", line)
	}
	p, err := strconv.ParseUint(rest, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("vsock handshake reply %q: bad host port: %w", line, err)
	}
	return uint32(p), nil
}
