package net_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/cube-runtime/cube/hypervisor/virtio"
	vnet "github.com/cube-runtime/cube/hypervisor/virtio/net"
	"github.com/cube-runtime/cube/hypervisor/virtio/virtiotest"
)

// The backend may only hand the guest offloads it negotiated: anything else
// is dropped and counted; a DATA_VALID hint for a guest without GUEST_CSUM
// is cleared.
func TestRxHeaderChecks(t *testing.T) {
	for _, c := range []struct {
		name     string
		features uint64
		h        vnet.Header
		ok       bool
		want     vnet.Header
	}{
		{"hint cleared", virtio.FVersion1, vnet.Header{Flags: vnet.HdrFDataValid}, true, vnet.Header{NumBuffers: 1}},
		{"partial csum, no GUEST_CSUM", virtio.FVersion1, vnet.Header{Flags: vnet.HdrFNeedsCsum, CsumStart: 34, CsumOffset: 16}, false, vnet.Header{}},
		{"tso4 without GUEST_TSO4", virtio.FVersion1 | vnet.FGuestCsum,
			vnet.Header{Flags: vnet.HdrFNeedsCsum, GSOType: vnet.GSOTCPv4, GSOSize: 1448, CsumStart: 34, CsumOffset: 16}, false, vnet.Header{}},
		{"ecn without GUEST_ECN", virtio.FVersion1 | vnet.FGuestCsum | vnet.FGuestTSO4,
			vnet.Header{Flags: vnet.HdrFNeedsCsum, GSOType: vnet.GSOTCPv4 | vnet.GSOECN, GSOSize: 1448, CsumStart: 34, CsumOffset: 16}, false, vnet.Header{}},
		{"udp never", allFeatures, vnet.Header{Flags: vnet.HdrFNeedsCsum, GSOType: vnet.GSOUDP, GSOSize: 1448, CsumStart: 34, CsumOffset: 6}, false, vnet.Header{}},
		{"csum beyond frame", allFeatures, vnet.Header{Flags: vnet.HdrFNeedsCsum, CsumStart: 990, CsumOffset: 16}, false, vnet.Header{}},
		{"tso4", allFeatures, vnet.Header{Flags: vnet.HdrFNeedsCsum | 4, GSOType: vnet.GSOTCPv4, HdrLen: 54, GSOSize: 1448, CsumStart: 34, CsumOffset: 16}, true,
			vnet.Header{Flags: vnet.HdrFNeedsCsum, GSOType: vnet.GSOTCPv4, HdrLen: 54, GSOSize: 1448, CsumStart: 34, CsumOffset: 16, NumBuffers: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := newGuest(t, newFake(true, allOffloads), c.features|vnet.FMrgRxbuf)
			bufs := g.postRx(1, 2048)
			if !g.dev.Deliver(withHeader(c.h, frame(1000, 0))) {
				t.Fatal("frame waits")
			}
			u := g.d.PopUsed(vnet.RxQueue)
			s := g.dev.Stats()
			if !c.ok {
				if len(u) != 0 || s.RxBadHeader != 1 {
					t.Errorf("not refused: used %+v stats %+v", u, s)
				}
				return
			}
			if len(u) != 1 {
				t.Fatalf("used %+v stats %+v", u, s)
			}
			if h := g.header(bufs[u[0].ID]); h != c.want {
				t.Errorf("header %+v, want %+v", h, c.want)
			}
		})
	}
}

// Without the tap's header the device makes up a zero one.
func TestRxWithoutVnetHeader(t *testing.T) {
	g := newGuest(t, newFake(false, 0), virtio.FVersion1|vnet.FMrgRxbuf)
	bufs := g.postRx(1, 2048)
	g.be.rx <- frame(600, 7)
	u := g.waitUsed(vnet.RxQueue, 1)
	if u[0].Len != vnet.HeaderLen+600 || g.header(bufs[u[0].ID]) != (vnet.Header{NumBuffers: 1}) ||
		!bytes.Equal(g.d.Mem.Bytes(bufs[u[0].ID]+vnet.HeaderLen, 600), frame(600, 7)) {
		t.Errorf("used %+v", u)
	}
}

func TestRxBadChains(t *testing.T) {
	g := newGuest(t, newFake(true, allOffloads), allFeatures)
	a := g.d.Alloc(4096)
	// A readable rx chain: returned unused, the frame is dropped.
	g.d.AddChain(vnet.RxQueue, []virtiotest.Desc{{Addr: a, Len: 2048}})
	g.d.Kick(vnet.RxQueue)
	if !g.dev.Deliver(withHeader(vnet.Header{}, frame(100, 0))) {
		t.Fatal("waits")
	}
	if u := g.d.PopUsed(vnet.RxQueue); len(u) != 1 || u[0].Len != 0 {
		t.Errorf("used %+v", u)
	}
	// A good buffer then one outside RAM, for a frame needing both: both
	// come back unused.
	g.d.AddChain(vnet.RxQueue, []virtiotest.Desc{{Addr: a, Len: 1024, Write: true}})
	g.d.AddChain(vnet.RxQueue, []virtiotest.Desc{{Addr: virtiotest.MemSize - 16, Len: 2048, Write: true}})
	if !g.dev.Deliver(withHeader(vnet.Header{}, frame(2000, 0))) {
		t.Fatal("waits")
	}
	if u := g.d.PopUsed(vnet.RxQueue); len(u) != 2 || u[0].Len != 0 || u[1].Len != 0 {
		t.Errorf("used %+v", u)
	}
	// A malformed chain (next out of the table) after a good buffer.
	_, desc, _, _ := g.d.QueueLayout(vnet.RxQueue)
	g.d.AddChain(vnet.RxQueue, []virtiotest.Desc{{Addr: a, Len: 1024, Write: true}})
	head := g.d.AddChain(vnet.RxQueue, []virtiotest.Desc{{Addr: a, Len: 4, Write: true}, {Addr: a, Len: 4, Write: true}})
	g.d.PutDesc(desc, head, a, 4, 3, 999)
	if !g.dev.Deliver(withHeader(vnet.Header{}, frame(2000, 0))) {
		t.Fatal("waits")
	}
	if u := g.d.PopUsed(vnet.RxQueue); len(u) != 2 || u[0].Len != 0 || u[1].Len != 0 {
		t.Errorf("used %+v", u)
	}
	if s := g.dev.Stats(); s.RxBadChain != 3 || s.RxFrames != 0 {
		t.Errorf("stats %+v, want 3 bad chains", s)
	}
	// The device still works.
	bufs := g.postRx(1, 2048)
	if !g.dev.Deliver(withHeader(vnet.Header{}, frame(100, 1))) {
		t.Fatal("waits")
	}
	if u := g.d.PopUsed(vnet.RxQueue); len(u) != 1 || !bytes.Equal(g.d.Mem.Bytes(bufs[u[0].ID]+vnet.HeaderLen, 100), frame(100, 1)) {
		t.Errorf("used %+v", u)
	}
}

// A frame larger than every buffer the ring can hold is dropped, the buffers stay.
func TestRxLargerThanRing(t *testing.T) {
	g := newGuest(t, newFake(true, allOffloads), allFeatures)
	g.postRx(64, 64)
	if !g.dev.Deliver(withHeader(vnet.Header{}, frame(5000, 0))) {
		t.Fatal("waits for buffers that can never come")
	}
	if u := g.d.PopUsed(vnet.RxQueue); len(u) != 0 {
		t.Errorf("used %+v", u)
	}
	if !g.dev.Deliver(withHeader(vnet.Header{}, frame(60, 0))) {
		t.Fatal("waits")
	}
	if u := g.d.PopUsed(vnet.RxQueue); len(u) != 2 || u[0].Len != 64 || u[1].Len != 8 {
		t.Errorf("used %+v", u)
	}
	if s := g.dev.Stats(); s.RxDropped != 1 || s.RxFrames != 1 {
		t.Errorf("stats %+v", s)
	}
}

// A corrupt rx ring puts the device into DEVICE_NEEDS_RESET once; later
// frames are dropped until the driver resets it.
func TestRxCorruptRing(t *testing.T) {
	g := newGuest(t, newFake(true, allOffloads), allFeatures)
	g.d.SetAvailIdx(vnet.RxQueue, 1000)
	for i := 0; i < 3; i++ {
		if !g.dev.Deliver(withHeader(vnet.Header{}, frame(100, 0))) {
			t.Fatal("waits")
		}
	}
	if st := g.d.Status(); st&virtio.StatusNeedsReset == 0 {
		t.Errorf("status %#x, want NEEDS_RESET", st)
	}
	if s := g.dev.Stats(); s.RxDropped != 2 {
		t.Errorf("stats %+v, want 2 dropped after the reset request", s)
	}
}

// Pause holds the frame (no guest memory written) until Resume; a driver
// reset drops frames until the driver is back.
func TestRxPauseAndReset(t *testing.T) {
	g := newGuest(t, newFake(true, allOffloads), allFeatures)
	bufs := g.postRx(2, 2048)
	g.d.Tr.Pause()
	g.be.rx <- withHeader(vnet.Header{}, frame(100, 8))
	time.Sleep(50 * time.Millisecond)
	if u := g.d.PopUsed(vnet.RxQueue); len(u) != 0 {
		t.Fatalf("used %+v while paused", u)
	}
	g.d.Tr.Resume()
	u := g.waitUsed(vnet.RxQueue, 1)
	if !bytes.Equal(g.d.Mem.Bytes(bufs[u[0].ID]+vnet.HeaderLen, 100), frame(100, 8)) {
		t.Error("frame differs")
	}
	g.d.Tr.Reset()
	g.be.rx <- withHeader(vnet.Header{}, frame(100, 8))
	deadline := time.Now().Add(wait)
	for g.dev.Stats().RxDropped != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("frame to a reset device not dropped: %+v", g.dev.Stats())
		}
		time.Sleep(time.Millisecond)
	}
}

// Close ends the receive goroutine even while it waits for buffers.
func TestCloseWhileWaiting(t *testing.T) {
	be := newFake(true, allOffloads)
	g := newGuest(t, be, allFeatures)
	be.rx <- withHeader(vnet.Header{}, frame(100, 0))
	time.Sleep(20 * time.Millisecond)
	done := make(chan error)
	go func() { done <- g.dev.Close() }()
	select {
	case <-done:
	case <-time.After(wait):
		t.Fatal("Close hangs")
	}
}
