package net_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/cube-runtime/cube/hypervisor/virtio"
	vnet "github.com/cube-runtime/cube/hypervisor/virtio/net"
	"github.com/cube-runtime/cube/hypervisor/virtio/virtiotest"
)

func TestConfigAndFeatures(t *testing.T) {
	g := newGuest(t, newFake(true, allOffloads), allFeatures)
	cfg := g.d.DeviceConfig(0, 8)
	if !bytes.Equal(cfg[:6], testMAC[:]) || le16(cfg[6:]) != vnet.StatusLinkUp {
		t.Errorf("config %x, want mac %s and link up", cfg, testMAC)
	}
	if got := g.d.Tr.NegotiatedFeatures(); got != allFeatures {
		t.Errorf("negotiated %#x, want %#x", got, allFeatures)
	}
	if id := g.d.CfgRead32(0) >> 16; id != 0x1041 {
		t.Errorf("pci device id %#x, want 0x1041", id)
	}
	// The tap is told what the guest takes.
	if got := g.be.set; len(got) != 1 || got[0] != allOffloads {
		t.Errorf("offloads set %#x, want [%#x]", got, allOffloads)
	}
	// A backend without the header offers no offloads; one with checksum
	// offload only offers no guest TSO.
	for _, c := range []struct {
		be   *fake
		want uint64
	}{
		{newFake(false, 0), vnet.FMAC | vnet.FStatus | vnet.FMrgRxbuf},
		{newFake(true, vnet.TunFCsum), vnet.FMAC | vnet.FStatus | vnet.FMrgRxbuf | vnet.FCsum | vnet.FHostTSO4 |
			vnet.FHostTSO6 | vnet.FHostECN | vnet.FGuestCsum},
	} {
		dev, err := vnet.New(vnet.Options{MAC: testMAC, Backend: c.be})
		if err != nil {
			t.Fatal(err)
		}
		if dev.Features() != c.want {
			t.Errorf("features %#x, want %#x", dev.Features(), c.want)
		}
		dev.Close()
	}
	if _, err := vnet.New(vnet.Options{MAC: vnet.MAC{1, 2, 3, 4, 5, 6}, Backend: newFake(false, 0)}); err == nil {
		t.Error("multicast mac accepted")
	}
	if _, err := vnet.New(vnet.Options{MAC: testMAC}); err == nil {
		t.Error("no backend accepted")
	}
}

func TestTxFrame(t *testing.T) {
	g := newGuest(t, newFake(true, allOffloads), allFeatures)
	f := frame(1000, 1)
	// A TSO frame: the header goes to the tap as the guest wrote it, with
	// num_buffers (meaningless on tx) cleared.
	h := vnet.Header{Flags: vnet.HdrFNeedsCsum, GSOType: vnet.GSOTCPv4, HdrLen: 54, GSOSize: 1448, CsumStart: 34, CsumOffset: 16, NumBuffers: 7}
	g.txFrame(h, f)
	if u := g.waitUsed(vnet.TxQueue, 1); u[0].Len != 0 {
		t.Errorf("tx used %+v, want length 0", u)
	}
	sent := g.be.sent()
	h.NumBuffers = 0
	if len(sent) != 1 || !bytes.Equal(sent[0], withHeader(h, f)) {
		t.Fatalf("backend got %d frames, want the header and frame", len(sent))
	}
	// Header and frame in one descriptor, through an indirect table.
	a := g.d.Alloc(vnet.HeaderLen + 60)
	g.d.Mem.Put(a, withHeader(vnet.Header{}, frame(60, 2)))
	g.d.AddIndirect(vnet.TxQueue, []virtiotest.Desc{{Addr: a, Len: vnet.HeaderLen + 60}})
	g.d.Kick(vnet.TxQueue)
	g.waitUsed(vnet.TxQueue, 1)
	if sent := g.be.sent(); len(sent) != 1 || !bytes.Equal(sent[0][vnet.HeaderLen:], frame(60, 2)) {
		t.Errorf("indirect frame not sent whole: %d frames", len(sent))
	}
	if s := g.dev.Stats(); s.TxFrames != 2 || s.TxBytes != 1060 {
		t.Errorf("stats %+v", s)
	}
}

// Without the tap's header the device strips the guest's.
func TestTxWithoutVnetHeader(t *testing.T) {
	g := newGuest(t, newFake(false, 0), virtio.FVersion1|vnet.FMAC)
	g.txFrame(vnet.Header{}, frame(100, 3))
	g.waitUsed(vnet.TxQueue, 1)
	if sent := g.be.sent(); len(sent) != 1 || !bytes.Equal(sent[0], frame(100, 3)) {
		t.Errorf("backend got %d frames, want the bare frame", len(sent))
	}
	// Offloads cannot be negotiated, so a header asking for one is refused.
	g.txFrame(vnet.Header{Flags: vnet.HdrFNeedsCsum, CsumStart: 34, CsumOffset: 6}, frame(100, 3))
	g.waitUsed(vnet.TxQueue, 1)
	if s := g.dev.Stats(); s.TxBadHeader != 1 || len(g.be.sent()) != 0 {
		t.Errorf("offloaded frame not refused: %+v", s)
	}
}

// Every malformed tx chain comes back unused and counted; nothing reaches the tap.
func TestTxBadChains(t *testing.T) {
	g := newGuest(t, newFake(true, allOffloads), virtio.FVersion1|vnet.FMAC|vnet.FCsum)
	a := g.d.Alloc(vnet.HeaderLen + vnet.MaxPacket + 16)
	g.d.Mem.Put(a, withHeader(vnet.Header{}, frame(100, 0)))
	chains := [][]virtiotest.Desc{
		{{Addr: a, Len: vnet.HeaderLen + 100, Write: true}},                // writable
		{{Addr: a, Len: vnet.HeaderLen}, {Addr: a, Len: 100, Write: true}}, // writable data
		{{Addr: a, Len: 8}}, // shorter than the header
		{{Addr: a, Len: vnet.HeaderLen + vnet.MaxPacket + 1}},                                 // longer than a frame
		{{Addr: virtiotest.MemSize - 8, Len: vnet.HeaderLen + 100}},                           // outside RAM
		{{Addr: a, Len: vnet.HeaderLen + 100}, {Addr: 1 << 62, Len: 1 << 31}},                 // wraps past any RAM
		{{Addr: a, Len: vnet.HeaderLen + 10}},                                                 // not a frame (< 14 bytes)
		{{Addr: a, Len: vnet.HeaderLen}, {Addr: a + vnet.HeaderLen, Len: vnet.MaxPacket + 1}}, // split, too long
	}
	for _, c := range chains {
		g.d.AddChain(vnet.TxQueue, c)
	}
	// A chain whose next index is out of the table: the queue drops it.
	_, desc, _, _ := g.d.QueueLayout(vnet.TxQueue)
	head := g.d.AddChain(vnet.TxQueue, []virtiotest.Desc{{Addr: a, Len: 4}, {Addr: a, Len: 4}})
	g.d.PutDesc(desc, head, a, 4, 1, 999)
	g.d.Kick(vnet.TxQueue)
	for _, u := range g.waitUsed(vnet.TxQueue, len(chains)+1) {
		if u.Len != 0 {
			t.Errorf("used %+v", u)
		}
	}
	s := g.dev.Stats()
	if s.TxBadChain != uint64(len(chains)) || s.TxBadHeader != 1 || s.TxFrames != 0 {
		t.Errorf("stats %+v, want %d bad chains, 1 bad header", s, len(chains))
	}
	// Headers asking for what was not negotiated (this guest has CSUM only).
	for _, h := range []vnet.Header{
		{Flags: vnet.HdrFNeedsCsum, GSOType: vnet.GSOTCPv4, GSOSize: 1448, CsumStart: 34, CsumOffset: 16},
		{Flags: vnet.HdrFNeedsCsum, GSOType: vnet.GSOUDP, GSOSize: 1448, CsumStart: 34, CsumOffset: 6},
		{Flags: vnet.HdrFNeedsCsum, CsumStart: 95, CsumOffset: 6}, // checksum beyond the frame
	} {
		g.txFrame(h, frame(100, 0))
	}
	g.waitUsed(vnet.TxQueue, 3)
	if s := g.dev.Stats(); s.TxBadHeader != 4 || len(g.be.sent()) != 0 {
		t.Errorf("stats %+v, frames sent %d", s, len(g.be.sent()))
	}
	// A backend error is counted, the chain still comes back.
	g.be.mu.Lock()
	g.be.writeErr = errors.New("tap down")
	g.be.mu.Unlock()
	g.txFrame(vnet.Header{}, frame(100, 0))
	g.waitUsed(vnet.TxQueue, 1)
	if s := g.dev.Stats(); s.TxErrors != 1 {
		t.Errorf("stats %+v, want 1 tx error", s)
	}
}

func TestRxFrame(t *testing.T) {
	g := newGuest(t, newFake(true, allOffloads), allFeatures)
	bufs := g.postRx(4, 2048)
	f := frame(1514, 9)
	g.be.rx <- withHeader(vnet.Header{Flags: vnet.HdrFDataValid}, f)
	u := g.waitUsed(vnet.RxQueue, 1)
	if u[0].Len != vnet.HeaderLen+1514 {
		t.Fatalf("used %+v", u)
	}
	a := bufs[u[0].ID]
	if h := g.header(a); h != (vnet.Header{Flags: vnet.HdrFDataValid, NumBuffers: 1}) {
		t.Errorf("header %+v", h)
	}
	if got := g.d.Mem.Bytes(a+vnet.HeaderLen, 1514); !bytes.Equal(got, f) {
		t.Error("frame bytes differ")
	}
	if s := g.dev.Stats(); s.RxFrames != 1 || s.RxBytes != 1514 {
		t.Errorf("stats %+v", s)
	}
}

// A 5000-byte TSO frame spans three 2 KiB mergeable buffers, in order.
func TestRxMergeable(t *testing.T) {
	g := newGuest(t, newFake(true, allOffloads), allFeatures)
	bufs := g.postRx(2, 2048)
	f := frame(5000, 4)
	h := vnet.Header{Flags: vnet.HdrFNeedsCsum, GSOType: vnet.GSOTCPv6, HdrLen: 74, GSOSize: 1428, CsumStart: 54, CsumOffset: 16}
	g.be.rx <- withHeader(h, f)
	// Two buffers are not enough: the device waits without consuming them.
	time.Sleep(50 * time.Millisecond)
	if u := g.d.PopUsed(vnet.RxQueue); len(u) != 0 {
		t.Fatalf("used %+v before enough buffers were posted", u)
	}
	for k, v := range g.postRx(1, 2048) {
		bufs[k] = v
	}
	u := g.waitUsed(vnet.RxQueue, 3)
	var got []byte
	for i, e := range u {
		want := uint32(2048)
		if i == 2 {
			want = vnet.HeaderLen + 5000 - 4096
		}
		if e.Len != want || e.ID != uint32(i) {
			t.Errorf("used[%d] = %+v, want head %d len %d", i, e, i, want)
		}
		got = append(got, g.d.Mem.Bytes(bufs[e.ID], int(e.Len))...)
	}
	h.NumBuffers = 3
	if !bytes.Equal(got, withHeader(h, f)) {
		t.Error("frame across buffers differs")
	}
}

// Without MRG_RXBUF a frame goes into one chain (Linux's "big packets":
// header and pages in one chain); a chain too small drops the frame and
// stays posted for the next.
func TestRxNonMergeable(t *testing.T) {
	g := newGuest(t, newFake(true, allOffloads), allFeatures&^vnet.FMrgRxbuf)
	a := g.d.Alloc(vnet.HeaderLen + 3*4096)
	g.d.AddChain(vnet.RxQueue, []virtiotest.Desc{{Addr: a, Len: vnet.HeaderLen, Write: true},
		{Addr: a + vnet.HeaderLen, Len: 4096, Write: true}, {Addr: a + vnet.HeaderLen + 4096, Len: 8192, Write: true}})
	small := g.d.Alloc(256)
	g.d.AddChain(vnet.RxQueue, []virtiotest.Desc{{Addr: small, Len: 256, Write: true}})
	g.d.Kick(vnet.RxQueue)
	f := frame(9000, 5)
	g.be.rx <- withHeader(vnet.Header{}, f)
	if u := g.waitUsed(vnet.RxQueue, 1); u[0].Len != vnet.HeaderLen+9000 {
		t.Fatalf("used %+v", u)
	}
	if h := g.header(a); h.NumBuffers != 1 || !bytes.Equal(g.d.Mem.Bytes(a+vnet.HeaderLen, 9000), f) {
		t.Errorf("header %+v or frame differs", h)
	}
	if !g.dev.Deliver(withHeader(vnet.Header{}, frame(1000, 0))) {
		t.Fatal("a frame larger than the buffer waits instead of being dropped")
	}
	if !g.dev.Deliver(withHeader(vnet.Header{}, frame(200, 6))) {
		t.Fatal("small frame not delivered")
	}
	if u := g.waitUsed(vnet.RxQueue, 1); u[0].Len != vnet.HeaderLen+200 || !bytes.Equal(g.d.Mem.Bytes(small+vnet.HeaderLen, 200), frame(200, 6)) {
		t.Errorf("used %+v", u)
	}
	if s := g.dev.Stats(); s.RxDropped != 1 || s.RxFrames != 2 {
		t.Errorf("stats %+v", s)
	}
}
