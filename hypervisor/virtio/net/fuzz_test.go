package net_test

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/virtio"
	vnet "github.com/cube-runtime/cube/hypervisor/virtio/net"
	"github.com/cube-runtime/cube/hypervisor/virtio/virtiotest"
)

// fuzzFeatures picks a negotiated feature set from a byte.
func fuzzFeatures(b uint8) uint64 {
	f := uint64(virtio.FVersion1 | virtio.FRingIndirectDesc | vnet.FMAC)
	for i, bit := range []uint64{vnet.FCsum, vnet.FGuestCsum, vnet.FHostTSO4, vnet.FGuestTSO4, vnet.FHostTSO6, vnet.FGuestTSO6, vnet.FMrgRxbuf, vnet.FHostECN} {
		if b&(1<<i) != 0 {
			f |= bit
		}
	}
	return f
}

// FuzzTx sends arbitrary bytes as a guest tx chain (split in two, the second
// part optionally writable, optionally through an indirect table) to
// long-lived devices of two feature sets: no panic, the chain always comes
// back with length 0, and whatever reaches the backend is a frame whose
// header passes the checks for what was negotiated.
func FuzzTx(f *testing.F) {
	type dev struct {
		g        *guest
		features uint64
		scratch  uint64
		table    uint64
	}
	var devs []dev
	for _, feat := range []uint64{fuzzFeatures(0xff), fuzzFeatures(0)} {
		be := newFake(true, allOffloads)
		dv, err := vnet.New(vnet.Options{MAC: testMAC, Backend: be})
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { dv.Close() })
		d := virtiotest.NewDriverSize(f, dv, virtio.PCIOptions{Class: 0x02}, 4<<20)
		if st := d.Init(feat, 64); st != 0xF {
			f.Fatalf("status %#x", st)
		}
		devs = append(devs, dev{&guest{t: f, d: d, dev: dv, be: be}, feat, d.Alloc(vnet.HeaderLen + vnet.MaxPacket + 64), d.Alloc(64)})
	}
	f.Add(withHeader(vnet.Header{}, frame(60, 0)), uint16(12), uint8(0))
	f.Add(withHeader(vnet.Header{Flags: 1, GSOType: 1, HdrLen: 54, GSOSize: 1448, CsumStart: 34, CsumOffset: 16}, tcpFrame(3000, "x")), uint16(66), uint8(0))
	f.Add(withHeader(vnet.Header{Flags: 1, GSOType: 0x84, GSOSize: 1, CsumStart: 0xffff, CsumOffset: 0xffff}, frame(20, 0)), uint16(3), uint8(5))
	f.Add([]byte{1, 2, 3}, uint16(1), uint8(2))
	f.Fuzz(func(t *testing.T, pkt []byte, split uint16, mode uint8) {
		if len(pkt) > vnet.HeaderLen+vnet.MaxPacket+32 {
			pkt = pkt[:vnet.HeaderLen+vnet.MaxPacket+32]
		}
		dv := devs[mode&1]
		g := dv.g
		g.d.Mem.Put(dv.scratch, pkt)
		cut := min(int(split), len(pkt))
		descs := []virtiotest.Desc{{Addr: dv.scratch, Len: uint32(cut)},
			{Addr: dv.scratch + uint64(cut), Len: uint32(len(pkt) - cut), Write: mode&2 != 0}}
		if mode&4 != 0 {
			g.d.AddIndirectAt(vnet.TxQueue, dv.table, descs)
		} else {
			g.d.AddChain(vnet.TxQueue, descs)
		}
		g.d.Kick(vnet.TxQueue)
		if u := g.d.PopUsed(vnet.TxQueue); len(u) != 1 || u[0].Len != 0 {
			t.Fatalf("tx used %+v", u)
		}
		for _, out := range g.be.sent() {
			h, err := vnet.ParseHeader(out)
			if err != nil {
				t.Fatal(err)
			}
			if h2, err := vnet.CheckTx(h, len(out)-vnet.HeaderLen, dv.features); err != nil || h2 != h {
				t.Fatalf("sent header %+v fails the checks: %v", h, err)
			}
			if !bytes.Equal(out[vnet.HeaderLen:], pkt[vnet.HeaderLen:]) {
				t.Fatal("sent frame differs from the guest's")
			}
		}
	})
}

// FuzzRx delivers an arbitrary frame from the backend into up to four
// guest rx chains of arbitrary sizes (some readable, some outside RAM) of a
// device the driver has just reset and brought up with arbitrary features:
// no panic, and either the frame is in the chains whole, with a header that
// passes the checks for the guest's features and num_buffers equal to the
// chains used, or nothing is written (every chain returned has length 0).
var zeroRings [0x20000]byte

func FuzzRx(f *testing.F) {
	const memSize = 2 << 20
	dv, err := vnet.New(vnet.Options{MAC: testMAC, Backend: newFake(true, allOffloads)})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { dv.Close() })
	d := virtiotest.NewDriverSize(f, dv, virtio.PCIOptions{Class: 0x02}, memSize)
	f.Add(withHeader(vnet.Header{}, frame(60, 0)), uint8(0xff), []byte{0, 8, 0, 8})
	f.Add(withHeader(vnet.Header{Flags: 1, GSOType: 4, HdrLen: 74, GSOSize: 1428, CsumStart: 54, CsumOffset: 16}, frame(5000, 1)), uint8(0x7f), []byte{0, 8, 0, 8, 0, 8})
	f.Add(withHeader(vnet.Header{Flags: 3, GSOType: 0x81, GSOSize: 0}, frame(20, 0)), uint8(0x0a), []byte{0x80, 1, 0xff, 0xff})
	f.Add([]byte{1}, uint8(0), []byte{})
	f.Fuzz(func(t *testing.T, in []byte, feat uint8, layout []byte) {
		if len(in) > vnet.HeaderLen+vnet.MaxPacket+32 {
			in = in[:vnet.HeaderLen+vnet.MaxPacket+32]
		}
		features := fuzzFeatures(feat)
		d.T = t
		d.Mem.Put(0x10000, zeroRings[:])          // a driver starts with zeroed rings (virtiotest puts queue i at 0x10000*(i+1))
		if st := d.Init(features, 8); st != 0xF { // a reset first: fresh queues
			t.Fatalf("status %#x", st)
		}
		before := dv.Stats().RxFrames
		addrs := map[uint32]uint64{}
		for i := 0; i+2 <= len(layout) && i < 8; i += 2 {
			size := uint32(binary.LittleEndian.Uint16(layout[i:]) &^ 0x8000)
			a := uint64(0x100000 + i*0x4000) // 32 KiB apart
			if layout[i+1]&0x40 != 0 {
				a = memSize - 64 // outside RAM for any size > 64
			}
			head := d.AddChain(vnet.RxQueue, []virtiotest.Desc{{Addr: a, Len: size, Write: layout[i+1]&0x80 == 0}})
			addrs[uint32(head)] = a
		}
		dv.Deliver(bytes.Clone(in))
		used := d.PopUsed(vnet.RxQueue)
		if dv.Stats().RxFrames == before {
			for _, u := range used {
				if u.Len != 0 {
					t.Fatalf("frame not delivered, yet used %+v", used)
				}
			}
			return
		}
		var got []byte
		for _, u := range used {
			got = append(got, d.Mem.Bytes(addrs[u.ID], int(u.Len))...)
		}
		h, err := vnet.ParseHeader(got)
		if err != nil {
			t.Fatal(err)
		}
		if int(h.NumBuffers) != len(used) || (features&vnet.FMrgRxbuf == 0 && len(used) != 1) {
			t.Fatalf("num_buffers %d, %d chains used", h.NumBuffers, len(used))
		}
		if _, err := vnet.CheckRx(h, len(got)-vnet.HeaderLen, features, h.NumBuffers); err != nil {
			t.Fatalf("delivered header %+v fails the checks: %v", h, err)
		}
		if !bytes.Equal(got[vnet.HeaderLen:], in[vnet.HeaderLen:]) {
			t.Fatal("delivered frame differs")
		}
	})
}

// FuzzParseMAC: what is accepted prints back as given (up to case) and is a
// unicast, non-zero address.
func FuzzParseMAC(f *testing.F) {
	for _, s := range []string{"52:54:00:12:34:56", "01:00:5e:00:00:01", "00:00:00:00:00:00", "AA:bb:cc:dd:ee:ff", "52:54:00:12:34", "52-54-00-12-34-56", "g2:54:00:12:34:56"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := vnet.ParseMAC(s)
		if err != nil {
			return
		}
		if !strings.EqualFold(m.String(), s) || m[0]&1 != 0 || m == (vnet.MAC{}) {
			t.Fatalf("%q accepted as %s", s, m)
		}
	})
}
