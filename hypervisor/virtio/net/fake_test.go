package net_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/cube-runtime/cube/hypervisor/virtio"
	vnet "github.com/cube-runtime/cube/hypervisor/virtio/net"
	"github.com/cube-runtime/cube/hypervisor/virtio/virtiotest"
)

// wait bounds how long a test waits for the receive goroutine; a hang
// guard, not a performance assertion.
const wait = 10 * time.Second

var testMAC = vnet.MAC{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}

// fake is a channel-backed Backend: frames sent on rx are what the device
// reads, frames the device writes are collected.
type fake struct {
	vnet     bool
	offloads uint32
	rx       chan []byte
	closed   chan struct{}
	once     sync.Once

	mu       sync.Mutex
	tx       [][]byte
	set      []uint32
	writeErr error
	discard  bool // benchmarks: count nothing, keep nothing
}

func newFake(vnetHdr bool, offloads uint32) *fake {
	return &fake{vnet: vnetHdr, offloads: offloads, rx: make(chan []byte, 16), closed: make(chan struct{})}
}

func (f *fake) ReadFrame(p []byte) (int, error) {
	select {
	case b := <-f.rx:
		return copy(p, b), nil
	case <-f.closed:
		return 0, os.ErrClosed
	}
}

func (f *fake) WriteFrame(p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.writeErr != nil {
		return f.writeErr
	}
	if f.discard {
		return nil
	}
	f.tx = append(f.tx, bytes.Clone(p))
	return nil
}

func (f *fake) VnetHdr() bool    { return f.vnet }
func (f *fake) Offloads() uint32 { return f.offloads }
func (f *fake) SetOffloads(tun uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if tun&^f.offloads != 0 {
		return errors.New("offload not supported")
	}
	f.set = append(f.set, tun)
	return nil
}
func (f *fake) Close() error { f.once.Do(func() { close(f.closed) }); return nil }

// sent returns and forgets the frames written so far.
func (f *fake) sent() [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.tx
	f.tx = nil
	return out
}

const allOffloads = vnet.TunFCsum | vnet.TunFTSO4 | vnet.TunFTSO6 | vnet.TunFTSOECN

// allFeatures is what Linux 6.1 accepts of what a device over a tap with
// every offload offers.
const allFeatures = virtio.FVersion1 | virtio.FRingEventIdx | virtio.FRingIndirectDesc | vnet.FMAC | vnet.FStatus |
	vnet.FMrgRxbuf | vnet.FCsum | vnet.FGuestCsum | vnet.FHostTSO4 | vnet.FHostTSO6 | vnet.FHostECN |
	vnet.FGuestTSO4 | vnet.FGuestTSO6 | vnet.FGuestECN

type guest struct {
	t   testing.TB
	d   *virtiotest.Driver
	dev *vnet.Device
	be  *fake
}

// newGuest makes a device over a fake backend and brings a driver up with
// features (queue size 64).
func newGuest(t testing.TB, be *fake, features uint64) *guest {
	t.Helper()
	dev, err := vnet.New(vnet.Options{MAC: testMAC, Backend: be})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	d := virtiotest.NewDriver(t, dev, nil)
	if st := d.Init(features, 64); st != 0xF {
		t.Fatalf("status %#x", st)
	}
	return &guest{t: t, d: d, dev: dev, be: be}
}

// frame is an Ethernet frame of n bytes (n >= 14) with a recognizable body.
func frame(n int, seed byte) []byte {
	b := make([]byte, n)
	copy(b, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x54, 0, 0x12, 0x34, 0x56, 0x88, 0xb5})
	for i := 14; i < n; i++ {
		b[i] = byte(i) ^ seed
	}
	return b
}

func withHeader(h vnet.Header, f []byte) []byte {
	b := make([]byte, vnet.HeaderLen+len(f))
	h.Encode(b)
	copy(b[vnet.HeaderLen:], f)
	return b
}

// postRx posts n rx chains of one writable buffer of size each; it
// returns their addresses by head.
func (g *guest) postRx(n int, size uint32) map[uint32]uint64 {
	out := map[uint32]uint64{}
	for i := 0; i < n; i++ {
		a := g.d.Alloc(int(size))
		head := g.d.AddChain(vnet.RxQueue, []virtiotest.Desc{{Addr: a, Len: size, Write: true}})
		out[uint32(head)] = a
	}
	g.d.Kick(vnet.RxQueue)
	return out
}

// waitUsed waits until n used entries of queue q are published and returns them.
func (g *guest) waitUsed(q, n int) []virtiotest.Used {
	g.t.Helper()
	var got []virtiotest.Used
	deadline := time.Now().Add(wait)
	for len(got) < n {
		got = append(got, g.d.PopUsed(q)...)
		if time.Now().After(deadline) {
			g.t.Fatalf("queue %d: %d used entries, want %d; stats %+v", q, len(got), n, g.dev.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	if len(got) != n {
		g.t.Fatalf("queue %d: %d used entries, want %d: %+v", q, len(got), n, got)
	}
	return got
}

// txFrame puts header+frame in guest memory as two descriptors (Linux
// puts the header in its own descriptor when it has no headroom) and kicks.
func (g *guest) txFrame(h vnet.Header, f []byte) {
	a := g.d.Alloc(vnet.HeaderLen + len(f))
	b := withHeader(h, f)
	g.d.Mem.Put(a, b)
	g.d.AddChain(vnet.TxQueue, []virtiotest.Desc{{Addr: a, Len: vnet.HeaderLen}, {Addr: a + vnet.HeaderLen, Len: uint32(len(f))}})
	g.d.Kick(vnet.TxQueue)
}

func (g *guest) header(a uint64) vnet.Header {
	h, err := vnet.ParseHeader(g.d.Mem.Bytes(a, vnet.HeaderLen))
	if err != nil {
		g.t.Fatal(err)
	}
	return h
}

func le16(b []byte) uint16 { return binary.LittleEndian.Uint16(b) }
