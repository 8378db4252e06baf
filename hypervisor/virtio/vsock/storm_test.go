package vsock_test

import (
	"fmt"
	"io"
	"math/rand"
	"net"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/virtio"
	"github.com/cube-runtime/cube/hypervisor/virtio/virtiotest"
	"github.com/cube-runtime/cube/hypervisor/virtio/vsock"
)

// TestRandomPacketStorm throws random but mostly well-formed packets (all ops,
// a few ports with echoing host listeners behind them) at the device: every
// tx chain comes back, rx ids are valid, the device never needs a reset.
// Run it with -race: the host-side goroutines run concurrently with it.
func TestRandomPacketStorm(t *testing.T) {
	g := newGuest(t)
	for p := 0; p < 4; p++ {
		ln, err := net.Listen("unix", fmt.Sprintf("%s_%d", g.uds, p))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { io.Copy(c, c); c.Close() }()
			}
		}()
	}
	scratch := g.d.Alloc(vsock.HeaderLen + vsock.MaxPayload + 64)
	r := rand.New(rand.NewSource(2))
	for i := 0; i < 20000; i++ {
		h := vsock.Header{SrcCID: guestCID, DstCID: 2, Type: 1, Op: uint16(r.Intn(9)), SrcPort: uint32(r.Intn(4)), DstPort: uint32(r.Intn(4)), Flags: uint32(r.Intn(4)), BufAlloc: uint32(r.Intn(100000)), FwdCnt: uint32(r.Intn(100000))}
		if r.Intn(20) == 0 {
			h.SrcCID = uint64(r.Intn(50))
		}
		if r.Intn(20) == 0 {
			h.Type = uint16(r.Intn(3))
		}
		n := r.Intn(200)
		h.Len = uint32(n)
		if r.Intn(30) == 0 {
			h.Len = r.Uint32()
		}
		pkt := make([]byte, vsock.HeaderLen+n)
		h.Encode(pkt)
		g.d.Mem.Put(scratch, pkt)
		cut := r.Intn(len(pkt) + 1)
		g.d.AddChain(vsock.TxQueue, []virtiotest.Desc{{Addr: scratch, Len: uint32(cut)}, {Addr: scratch + uint64(cut), Len: uint32(len(pkt) - cut)}})
		g.d.Kick(vsock.TxQueue)
		if g.d.Status()&virtio.StatusNeedsReset != 0 {
			t.Fatalf("iteration %d: device needs reset", i)
		}
		if u := g.d.PopUsed(vsock.TxQueue); len(u) != 1 {
			t.Fatalf("iteration %d: tx used %+v status %#x", i, u, g.d.Status())
		}
		for _, u := range g.d.PopUsed(vsock.RxQueue) {
			a, ok := g.rxBufs[u.ID]
			if !ok {
				t.Fatalf("unknown rx id %d", u.ID)
			}
			delete(g.rxBufs, u.ID)
			g.repostRx(a)
		}
		g.d.Kick(vsock.RxQueue)
	}
}
