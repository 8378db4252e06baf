package vsock_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/hypervisor/virtio"
	"github.com/cube-runtime/cube/hypervisor/virtio/virtiotest"
	"github.com/cube-runtime/cube/hypervisor/virtio/vsock"
)

const (
	guestCID = 42
	rxBufLen = 4096
	// wait bounds how long a test waits for an asynchronous packet; it is a
	// hang guard, not a performance assertion.
	wait = 10 * time.Second
)

type guest struct {
	t      testing.TB
	d      *virtiotest.Driver
	dev    *vsock.Device
	uds    string
	rxBufs map[uint32]uint64
	ready  []virtiotest.Used

	txScratch uint64
}

func newGuest(t testing.TB) *guest {
	t.Helper()
	dir, err := os.MkdirTemp("", "vsk") // short path: sun_path is 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	uds := filepath.Join(dir, "v.sock")
	dev, err := vsock.New(vsock.Options{GuestCID: guestCID, UDSPath: uds})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	d := virtiotest.NewDriver(t, dev, nil)
	if st := d.Init(virtio.FVersion1|virtio.FRingEventIdx, 64); st != 0xF {
		t.Fatalf("status %#x", st)
	}
	g := &guest{t: t, d: d, dev: dev, uds: uds, rxBufs: map[uint32]uint64{}}
	for i := 0; i < 16; i++ {
		g.postRx()
	}
	ev := d.Alloc(4)
	d.AddChain(vsock.EventQueue, []virtiotest.Desc{{Addr: ev, Len: 4, Write: true}})
	d.Kick(vsock.RxQueue)
	d.Kick(vsock.EventQueue)
	return g
}

// postRx adds a Linux 6.1 style rx buffer: header and payload as two descriptors.
func (g *guest) postRx() { g.repostRx(g.d.Alloc(vsock.HeaderLen + rxBufLen)) }

func (g *guest) repostRx(a uint64) {
	head := g.d.AddChain(vsock.RxQueue, []virtiotest.Desc{
		{Addr: a, Len: vsock.HeaderLen, Write: true},
		{Addr: a + vsock.HeaderLen, Len: rxBufLen, Write: true}})
	g.rxBufs[uint32(head)] = a
}

func (g *guest) send(h vsock.Header, payload []byte) {
	h.SrcCID, h.DstCID, h.Type = guestCID, vsock.HostCID, vsock.TypeStream
	if h.BufAlloc == 0 {
		h.BufAlloc = 1 << 20
	}
	h.Len = uint32(len(payload))
	b := make([]byte, vsock.HeaderLen+len(payload))
	h.Encode(b)
	copy(b[vsock.HeaderLen:], payload)
	// The device consumes tx packets synchronously inside Kick, so one
	// scratch buffer serves every send.
	if g.txScratch == 0 {
		g.txScratch = g.d.Alloc(vsock.HeaderLen + vsock.MaxPayload)
	}
	g.d.Mem.Put(g.txScratch, b)
	g.d.AddChain(vsock.TxQueue, []virtiotest.Desc{{Addr: g.txScratch, Len: uint32(len(b))}})
	g.d.Kick(vsock.TxQueue)
}

// recv waits for the next packet the device put in the rx queue.
func (g *guest) recv() (vsock.Header, []byte) {
	g.t.Helper()
	deadline := time.Now().Add(wait)
	for len(g.ready) == 0 {
		g.ready = append(g.ready, g.d.PopUsed(vsock.RxQueue)...)
		if len(g.ready) == 0 {
			if time.Now().After(deadline) {
				g.t.Fatal("no packet from the device")
			}
			time.Sleep(time.Millisecond)
		}
	}
	u := g.ready[0]
	g.ready = g.ready[1:]
	a, ok := g.rxBufs[u.ID]
	if !ok {
		g.t.Fatalf("used id %d is not an rx buffer", u.ID)
	}
	delete(g.rxBufs, u.ID)
	raw := g.d.Mem.Bytes(a, int(u.Len))
	h, err := vsock.ParseHeader(raw)
	if err != nil {
		g.t.Fatal(err)
	}
	if h.SrcCID != vsock.HostCID || h.DstCID != guestCID || h.Type != vsock.TypeStream {
		g.t.Fatalf("bad header %+v", h)
	}
	if int(h.Len) != len(raw)-vsock.HeaderLen {
		g.t.Fatalf("header len %d, used len %d", h.Len, u.Len)
	}
	g.repostRx(a)
	g.d.Kick(vsock.RxQueue)
	return h, raw[vsock.HeaderLen:]
}

// recvOp skips credit updates and returns the next packet with another op.
func (g *guest) recvOp() (vsock.Header, []byte) {
	g.t.Helper()
	for {
		h, p := g.recv()
		if h.Op != vsock.OpCreditUpdate {
			return h, p
		}
	}
}

// noPacket checks nothing arrives for a short while (used only to check that
// something is withheld; it can only pass wrongly, never fail wrongly).
func (g *guest) noPacket() {
	g.t.Helper()
	time.Sleep(100 * time.Millisecond)
	if u := g.d.PopUsed(vsock.RxQueue); len(u) != 0 {
		g.ready = append(g.ready, u...)
		h, _ := g.recv()
		g.t.Fatalf("unexpected packet %+v", h)
	}
}

func (g *guest) hostConnect(port uint32) (net.Conn, *bufio.Reader, vsock.Header) {
	g.t.Helper()
	c, err := net.Dial("unix", g.uds)
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "CONNECT %d\n", port)
	h, _ := g.recvOp()
	if h.Op != vsock.OpRequest || h.DstPort != port || h.SrcPort < 1<<30 {
		g.t.Fatalf("expected REQUEST to %d, got %+v", port, h)
	}
	g.send(vsock.Header{Op: vsock.OpResponse, SrcPort: port, DstPort: h.SrcPort}, nil)
	br := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(wait))
	line, err := br.ReadString('\n')
	if err != nil || line != fmt.Sprintf("OK %d\n", h.SrcPort) {
		g.t.Fatalf("handshake answer %q %v", line, err)
	}
	return c, br, h
}

func TestGuestCIDConfig(t *testing.T) {
	g := newGuest(t)
	if cid := binary.LittleEndian.Uint64(g.d.DeviceConfig(0, 8)); cid != guestCID {
		t.Errorf("guest_cid %d", cid)
	}
	if n := g.d.Read(virtio.CommonOffset+0x12, 2); n != 3 {
		t.Errorf("%d queues", n)
	}
}

func TestHostInitiatedConnection(t *testing.T) {
	g := newGuest(t)
	c, br, req := g.hostConnect(1234)
	local := req.SrcPort
	// host → guest
	if _, err := c.Write([]byte("hello guest")); err != nil {
		t.Fatal(err)
	}
	var got []byte
	for len(got) < len("hello guest") {
		h, p := g.recvOp()
		if h.Op != vsock.OpRW || h.SrcPort != local || h.DstPort != 1234 {
			t.Fatalf("expected RW, got %+v", h)
		}
		got = append(got, p...)
	}
	if string(got) != "hello guest" {
		t.Errorf("guest got %q", got)
	}
	// guest → host
	g.send(vsock.Header{Op: vsock.OpRW, SrcPort: 1234, DstPort: local}, []byte("hello host"))
	buf := make([]byte, 10)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "hello host" {
		t.Fatalf("host got %q %v", buf, err)
	}
	// The guest closes: the host sees EOF, the guest gets its RST.
	g.send(vsock.Header{Op: vsock.OpShutdown, Flags: 3, SrcPort: 1234, DstPort: local}, nil)
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("host read after guest close: %v", err)
	}
	h, _ := g.recvOp()
	if h.Op != vsock.OpRst || h.SrcPort != local {
		t.Errorf("expected RST, got %+v", h)
	}
}

func TestGuestInitiatedConnection(t *testing.T) {
	g := newGuest(t)
	ln, err := net.Listen("unix", g.uds+"_5000")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	g.send(vsock.Header{Op: vsock.OpRequest, SrcPort: 777, DstPort: 5000}, nil)
	h, _ := g.recvOp()
	if h.Op != vsock.OpResponse || h.SrcPort != 5000 || h.DstPort != 777 || h.BufAlloc != vsock.BufAlloc {
		t.Fatalf("expected RESPONSE, got %+v", h)
	}
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(wait))
	g.send(vsock.Header{Op: vsock.OpRW, SrcPort: 777, DstPort: 5000}, []byte("ping"))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("host got %q %v", buf, err)
	}
	c.Write([]byte("pong"))
	h, p := g.recvOp()
	if h.Op != vsock.OpRW || string(p) != "pong" {
		t.Fatalf("guest got %+v %q", h, p)
	}
	// The host closes: the guest hears SHUTDOWN(SEND) after the data.
	c.Close()
	h, _ = g.recvOp()
	if h.Op != vsock.OpShutdown || h.Flags != vsock.ShutdownSend {
		t.Fatalf("expected SHUTDOWN SEND, got %+v", h)
	}
	g.send(vsock.Header{Op: vsock.OpShutdown, Flags: 3, SrcPort: 777, DstPort: 5000}, nil)
	if h, _ = g.recvOp(); h.Op != vsock.OpRst {
		t.Fatalf("expected RST, got %+v", h)
	}
	// Packets for the closed connection are answered with RST.
	g.send(vsock.Header{Op: vsock.OpRW, SrcPort: 777, DstPort: 5000}, []byte("late"))
	if h, _ = g.recvOp(); h.Op != vsock.OpRst {
		t.Fatalf("expected RST for stale connection, got %+v", h)
	}
}

func TestGuestConnectRefused(t *testing.T) {
	g := newGuest(t)
	g.send(vsock.Header{Op: vsock.OpRequest, SrcPort: 1000, DstPort: 6000}, nil)
	h, _ := g.recvOp()
	if h.Op != vsock.OpRst || h.SrcPort != 6000 || h.DstPort != 1000 {
		t.Fatalf("expected RST, got %+v", h)
	}
}

func TestBadHandshakes(t *testing.T) {
	g := newGuest(t)
	for _, line := range []string{"HELLO\n", "CONNECT\n", "CONNECT x\n", "CONNECT 99999999999\n", strings.Repeat("A", 100)} {
		c, err := net.Dial("unix", g.uds)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte(line))
		c.SetReadDeadline(time.Now().Add(wait))
		// EOF, or ECONNRESET when the device closed with our bytes unread.
		n, err := c.Read(make([]byte, 8))
		if ne, ok := err.(net.Error); err == nil || ok && ne.Timeout() {
			t.Errorf("%q: read %d %v, want the device to close", line, n, err)
		}
		c.Close()
	}
	// No REQUEST reached the guest.
	g.noPacket()
}

func TestHostConnectGuestRefuses(t *testing.T) {
	g := newGuest(t)
	c, err := net.Dial("unix", g.uds)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT 99\n")
	h, _ := g.recvOp()
	g.send(vsock.Header{Op: vsock.OpRst, SrcPort: 99, DstPort: h.SrcPort}, nil)
	c.SetReadDeadline(time.Now().Add(wait))
	if _, err := c.Read(make([]byte, 8)); err != io.EOF {
		t.Errorf("host read %v, want EOF", err)
	}
}

func TestCreditIsRespected(t *testing.T) {
	g := newGuest(t)
	ln, err := net.Listen("unix", g.uds+"_7")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// The guest offers only 1000 bytes of buffer.
	g.send(vsock.Header{Op: vsock.OpRequest, SrcPort: 70, DstPort: 7, BufAlloc: 1000}, nil)
	if h, _ := g.recvOp(); h.Op != vsock.OpResponse {
		t.Fatalf("got %+v", h)
	}
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go c.Write(bytes.Repeat([]byte("x"), 5000))
	got := 0
	for got < 1000 {
		h, p := g.recvOp()
		if h.Op != vsock.OpRW {
			t.Fatalf("got %+v", h)
		}
		got += len(p)
	}
	if got != 1000 {
		t.Fatalf("guest got %d bytes with 1000 of credit", got)
	}
	g.noPacket()
	// The guest consumed everything: 1000 more bytes may come.
	g.send(vsock.Header{Op: vsock.OpCreditUpdate, SrcPort: 70, DstPort: 7, BufAlloc: 1000, FwdCnt: 1000}, nil)
	for got < 2000 {
		_, p := g.recvOp()
		got += len(p)
	}
	if got != 2000 {
		t.Fatalf("guest got %d bytes with 2000 of credit", got)
	}
	// CREDIT_REQUEST is answered with our credit.
	g.send(vsock.Header{Op: vsock.OpCreditRequest, SrcPort: 70, DstPort: 7, BufAlloc: 1000, FwdCnt: 2000}, nil)
	for {
		h, _ := g.recv()
		if h.Op == vsock.OpCreditUpdate {
			if h.BufAlloc != vsock.BufAlloc {
				t.Errorf("credit update %+v", h)
			}
			break
		}
	}
}

func TestGuestOverrunIsReset(t *testing.T) {
	g := newGuest(t)
	ln, err := net.Listen("unix", g.uds+"_8")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	g.send(vsock.Header{Op: vsock.OpRequest, SrcPort: 80, DstPort: 8}, nil)
	g.recvOp()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Nobody reads on the host side, so once the socket buffer is full no
	// credit comes back; the guest keeps sending far beyond our credit.
	chunk := make([]byte, vsock.MaxPayload)
	for i := 0; i < 64; i++ {
		g.send(vsock.Header{Op: vsock.OpRW, SrcPort: 80, DstPort: 8}, chunk)
	}
	if h, _ := g.recvOp(); h.Op != vsock.OpRst {
		t.Fatalf("expected RST for credit overrun, got %+v", h)
	}
}

func TestGuestToHostStreamWithCreditUpdates(t *testing.T) {
	g := newGuest(t)
	ln, err := net.Listen("unix", g.uds+"_9")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	g.send(vsock.Header{Op: vsock.OpRequest, SrcPort: 90, DstPort: 9}, nil)
	g.recvOp()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	total := 3 * vsock.BufAlloc
	want := make([]byte, total)
	for i := range want {
		want[i] = byte(i * 7)
	}
	done := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(c, int64(total)))
		done <- b
	}()
	// Send like Linux: never more than the credit the device granted.
	sent, fwd := 0, uint32(0)
	for sent < total {
		for uint32(sent)-fwd+vsock.MaxPayload > vsock.BufAlloc {
			h, _ := g.recv()
			if h.Op != vsock.OpCreditUpdate {
				t.Fatalf("expected credit update, got %+v", h)
			}
			fwd = h.FwdCnt
		}
		n := min(vsock.MaxPayload, total-sent)
		g.send(vsock.Header{Op: vsock.OpRW, SrcPort: 90, DstPort: 9}, want[sent:sent+n])
		sent += n
	}
	select {
	case got := <-done:
		if !bytes.Equal(got, want) {
			t.Fatalf("host got %d bytes, mismatch", len(got))
		}
	case <-time.After(wait):
		t.Fatal("host did not receive the stream")
	}
}

func TestTransportReset(t *testing.T) {
	g := newGuest(t)
	c, br, _ := g.hostConnect(55)
	g.dev.TransportReset()
	c.SetReadDeadline(time.Now().Add(wait))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("host connection survived transport reset: %v", err)
	}
	deadline := time.Now().Add(wait)
	var used []virtiotest.Used
	for len(used) == 0 && time.Now().Before(deadline) {
		used = g.d.PopUsed(vsock.EventQueue)
	}
	if len(used) != 1 || used[0].Len != 4 {
		t.Fatalf("event queue used %+v", used)
	}
	// The listener survived.
	g.hostConnect(56)
	// The state round trip keeps a pending event if there was no buffer.
	g.dev.TransportReset() // no event buffer posted now: stays pending
	st := g.dev.State()
	if !st.PendingEvent || st.GuestCID != guestCID {
		t.Errorf("state %+v", st)
	}
	if err := g.dev.Restore(st); err != nil {
		t.Fatal(err)
	}
	st.GuestCID = 7
	if err := g.dev.Restore(st); err == nil {
		t.Error("restore with another cid accepted")
	}
}

func TestForeignPacketsDropped(t *testing.T) {
	g := newGuest(t)
	// Wrong source CID and wrong destination CID: silently dropped.
	b := make([]byte, vsock.HeaderLen)
	for _, h := range []vsock.Header{
		{SrcCID: 99, DstCID: vsock.HostCID, Type: 1, Op: vsock.OpRequest, SrcPort: 1, DstPort: 2},
		{SrcCID: guestCID, DstCID: 5, Type: 1, Op: vsock.OpRequest, SrcPort: 1, DstPort: 2},
	} {
		h.Encode(b)
		a := g.d.Alloc(len(b))
		g.d.Mem.Put(a, b)
		g.d.AddChain(vsock.TxQueue, []virtiotest.Desc{{Addr: a, Len: uint32(len(b))}})
	}
	// Length field beyond the buffer: dropped.
	(vsock.Header{SrcCID: guestCID, DstCID: vsock.HostCID, Type: 1, Op: vsock.OpRW, Len: 5000}).Encode(b)
	a := g.d.Alloc(len(b))
	g.d.Mem.Put(a, b)
	g.d.AddChain(vsock.TxQueue, []virtiotest.Desc{{Addr: a, Len: uint32(len(b))}})
	g.d.Kick(vsock.TxQueue)
	if u := g.d.PopUsed(vsock.TxQueue); len(u) != 3 {
		t.Fatalf("tx used %+v", u)
	}
	g.noPacket()
	// A datagram-type packet is refused with RST.
	g.send(vsock.Header{Op: vsock.OpRequest, SrcPort: 3, DstPort: 4}, nil)
	g.recvOp() // RST (nothing listens on _4)
}

func TestNewValidation(t *testing.T) {
	if _, err := vsock.New(vsock.Options{GuestCID: 2, UDSPath: "/tmp/x"}); err == nil {
		t.Error("cid 2 accepted")
	}
	if _, err := vsock.New(vsock.Options{GuestCID: 3}); err == nil {
		t.Error("empty path accepted")
	}
	if _, err := vsock.New(vsock.Options{GuestCID: 3, UDSPath: "/nonexistent/dir/v.sock"}); err == nil {
		t.Error("unlistenable path accepted")
	}
	// A live socket is not stolen; a stale one is replaced.
	g := newGuest(t)
	if _, err := vsock.New(vsock.Options{GuestCID: 3, UDSPath: g.uds}); err == nil {
		t.Error("live socket path taken over")
	}
	stale := g.uds + "stale"
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	d, err := vsock.New(vsock.Options{GuestCID: 3, UDSPath: stale})
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	d.Close()
}

func TestParseConnect(t *testing.T) {
	for in, want := range map[string]uint32{"CONNECT 0": 0, "CONNECT 52\r": 52, "CONNECT 4294967295": 1<<32 - 1} {
		if got, err := vsock.ParseConnect(in); err != nil || got != want {
			t.Errorf("%q: %d %v", in, got, err)
		}
	}
	for _, in := range []string{"", "CONNECT", "CONNECT ", "CONNECT -1", "CONNECT 4294967296", "connect 1", "CONNECT 1 2"} {
		if _, err := vsock.ParseConnect(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

func TestPauseStopsGuestMemoryWrites(t *testing.T) {
	g := newGuest(t)
	c, _, _ := g.hostConnect(60)
	g.d.Tr.Pause()
	c.Write([]byte("while paused"))
	g.noPacket()
	g.d.Tr.Resume()
	h, p := g.recvOp()
	if h.Op != vsock.OpRW || string(p) != "while paused" {
		t.Fatalf("after resume got %+v %q", h, p)
	}
}

// TestSnapshotRestoreFlow follows the snapshot issue's sequence: pause, save
// transport and device state, build a new device over the same guest memory,
// restore, send the transport reset, resume: the guest gets the reset event
// and new host connections work.
func TestSnapshotRestoreFlow(t *testing.T) {
	g := newGuest(t)
	_, _, before := g.hostConnect(61)
	g.d.Tr.Pause()
	ts, ds := g.d.Tr.State(), g.dev.State()
	g.dev.Close()

	uds := g.uds + "2"
	dev2, err := vsock.New(vsock.Options{GuestCID: guestCID, UDSPath: uds})
	if err != nil {
		t.Fatal(err)
	}
	defer dev2.Close()
	tr2, err := virtio.NewPCI(dev2, virtio.PCIOptions{Mem: g.d.Mem, MSI: g.d.MSI})
	if err != nil {
		t.Fatal(err)
	}
	if err := dev2.Restore(ds); err != nil {
		t.Fatal(err)
	}
	if err := tr2.Restore(ts); err != nil {
		t.Fatal(err)
	}
	dev2.TransportReset()
	if u := g.d.PopUsed(vsock.EventQueue); len(u) != 0 {
		t.Fatal("event delivered while paused")
	}
	tr2.Resume()
	if u := g.d.PopUsed(vsock.EventQueue); len(u) != 1 || u[0].Len != 4 {
		t.Fatalf("event queue used %+v", u)
	}
	// The restored device serves a new host connection on the same rings.
	g.uds, g.dev = uds, dev2
	g.d.Swap(tr2)
	// A new connection gets a host port the snapshot's guest never saw.
	if _, _, h := g.hostConnect(62); h.SrcPort <= before.SrcPort {
		t.Fatalf("restored device reused host port %d (before the snapshot: %d)", h.SrcPort, before.SrcPort)
	}
}

// TestResetEventBeforeQueuedConnect: a host connect that arrives after the
// transport reset but before the transports resume (the restore window) must
// reach the guest after the reset event, or the guest's handling of the event
// would reset the new connection too.
func TestResetEventBeforeQueuedConnect(t *testing.T) {
	g := newGuest(t)
	for len(g.d.Interrupts()) > 0 {
		<-g.d.Interrupts()
	}
	g.d.Tr.Pause()
	g.dev.TransportReset()
	c, err := net.Dial("unix", g.uds)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT 63\n")
	// Let the handshake goroutine queue the request (paused: nothing reaches the guest).
	deadline := time.Now().Add(wait)
	for g.dev.State().NextPort == 1<<30 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	g.noPacket()
	g.d.Tr.Resume()
	var order []uint32
	for len(order) < 2 {
		select {
		case v := <-g.d.Interrupts():
			order = append(order, v)
		case <-time.After(wait):
			t.Fatalf("interrupts after resume: %v", order)
		}
	}
	if want := []uint32{virtiotest.VectorData(vsock.EventQueue), virtiotest.VectorData(vsock.RxQueue)}; order[0] != want[0] || order[1] != want[1] {
		t.Fatalf("interrupts after resume %#x, want the event queue's first %#x", order, want)
	}
	if h, _ := g.recvOp(); h.Op != vsock.OpRequest || h.DstPort != 63 {
		t.Fatalf("got %+v", h)
	}
}

func TestBytesAfterConnectLineAreKept(t *testing.T) {
	g := newGuest(t)
	c, err := net.Dial("unix", g.uds)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("CONNECT 77\nearly bytes"))
	h, _ := g.recvOp()
	if h.Op != vsock.OpRequest {
		t.Fatalf("got %+v", h)
	}
	g.send(vsock.Header{Op: vsock.OpResponse, SrcPort: 77, DstPort: h.SrcPort}, nil)
	var got []byte
	for len(got) < len("early bytes") {
		h, p := g.recvOp()
		if h.Op != vsock.OpRW {
			t.Fatalf("got %+v", h)
		}
		got = append(got, p...)
	}
	if string(got) != "early bytes" {
		t.Errorf("guest got %q", got)
	}
}

func BenchmarkHostToGuest(b *testing.B) {
	g := newGuest(b)
	ln, err := net.Listen("unix", g.uds+"_9")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	g.send(vsock.Header{Op: vsock.OpRequest, SrcPort: 90, DstPort: 9}, nil)
	g.recvOp()
	c, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	payload := make([]byte, rxBufLen)
	b.SetBytes(rxBufLen)
	b.ResetTimer()
	go func() {
		for i := 0; i < b.N; i++ {
			if _, err := c.Write(payload); err != nil {
				return
			}
		}
	}()
	got, fwd := 0, 0
	for got < b.N*rxBufLen {
		_, p := g.recvOp()
		got += len(p)
		if got-fwd >= 64<<10 {
			fwd = got
			g.send(vsock.Header{Op: vsock.OpCreditUpdate, SrcPort: 90, DstPort: 9, FwdCnt: uint32(fwd)}, nil)
		}
	}
}
