package vsock_test

import (
	"testing"

	"github.com/cube-runtime/cube/hypervisor/virtio/virtiotest"
	"github.com/cube-runtime/cube/hypervisor/virtio/vsock"
)

// FuzzTxPacket sends arbitrary bytes as guest tx packets (split over up to
// three descriptors) to one long-lived device: no panic, every chain returned.
func FuzzTxPacket(f *testing.F) {
	g := newGuest(f)
	scratch := g.d.Alloc(vsock.HeaderLen + vsock.MaxPayload + 64)
	seed := func(h vsock.Header, payload string) []byte {
		b := make([]byte, vsock.HeaderLen+len(payload))
		h.Encode(b)
		copy(b[vsock.HeaderLen:], payload)
		return b
	}
	f.Add(seed(vsock.Header{SrcCID: guestCID, DstCID: 2, Type: 1, Op: vsock.OpRequest, SrcPort: 1, DstPort: 2}, ""), uint8(0))
	f.Add(seed(vsock.Header{SrcCID: guestCID, DstCID: 2, Type: 1, Op: vsock.OpRW, Len: 3, SrcPort: 1, DstPort: 2}, "abc"), uint8(7))
	f.Add(seed(vsock.Header{SrcCID: guestCID, DstCID: 2, Type: 1, Op: vsock.OpShutdown, Flags: 3}, ""), uint8(20))
	f.Add(seed(vsock.Header{SrcCID: guestCID, DstCID: 2, Type: 2, Op: 9, Len: 1 << 31}, "x"), uint8(44))
	f.Fuzz(func(t *testing.T, pkt []byte, split uint8) {
		if len(pkt) > vsock.HeaderLen+vsock.MaxPayload {
			pkt = pkt[:vsock.HeaderLen+vsock.MaxPayload]
		}
		g.d.Mem.Put(scratch, pkt)
		cut := min(int(split), len(pkt))
		descs := []virtiotest.Desc{{Addr: scratch, Len: uint32(cut)}, {Addr: scratch + uint64(cut), Len: uint32(len(pkt) - cut)}}
		g.d.AddChain(vsock.TxQueue, descs)
		g.d.Kick(vsock.TxQueue)
		if u := g.d.PopUsed(vsock.TxQueue); len(u) != 1 {
			t.Fatalf("tx used %+v", u)
		}
		// Recycle rx buffers the device filled so replies keep flowing.
		for _, u := range g.d.PopUsed(vsock.RxQueue) {
			a := g.rxBufs[u.ID]
			delete(g.rxBufs, u.ID)
			g.repostRx(a)
		}
		g.d.Kick(vsock.RxQueue)
	})
}

func FuzzParseConnect(f *testing.F) {
	for _, s := range []string{"CONNECT 1", "CONNECT 4294967295", "CONNECT -1", "CONNECT 1\r", "CONNECT 0x10", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := vsock.ParseConnect(s)
		if err == nil && s != "CONNECT "+itoa(p) && s != "CONNECT "+itoa(p)+"\r" {
			// Leading zeros or '+' are accepted by strconv; they still name p.
			if len(s) > len("CONNECT ")+11 {
				t.Fatalf("%q accepted as %d", s, p)
			}
		}
	})
}

func itoa(v uint32) string {
	if v == 0 {
		return "0"
	}
	var b [10]byte
	i := len(b)
	for v > 0 {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
	}
	return string(b[i:])
}
