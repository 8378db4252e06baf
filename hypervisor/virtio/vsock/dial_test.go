package vsock_test

import (
	"context"
	"io"
	"net"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/virtio/vsock"
	"github.com/cube-runtime/cube/hypervisor/vsockdial"
)

// The host side the shim uses (vsockdial) and this device agree on the
// handshake: a dial completes once the guest accepts, and the guest's first
// bytes reach the dialer.
func TestVsockdialAgainstTheDevice(t *testing.T) {
	g := newGuest(t)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	type dialed struct {
		c   net.Conn
		err error
	}
	res := make(chan dialed, 1)
	go func() {
		c, err := vsockdial.Dial(ctx, g.uds, 1234)
		res <- dialed{c, err}
	}()
	h, _ := g.recvOp()
	if h.Op != vsock.OpRequest || h.DstPort != 1234 {
		t.Fatalf("expected REQUEST to 1234, got %+v", h)
	}
	g.send(vsock.Header{Op: vsock.OpResponse, SrcPort: 1234, DstPort: h.SrcPort}, nil)
	g.send(vsock.Header{Op: vsock.OpRW, SrcPort: 1234, DstPort: h.SrcPort, Len: 5}, []byte("hello"))
	d := <-res
	if d.err != nil {
		t.Fatal(d.err)
	}
	defer d.c.Close()
	buf := make([]byte, 5)
	if _, err := io.ReadFull(d.c, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("guest bytes after the handshake: %q %v", buf, err)
	}
}
