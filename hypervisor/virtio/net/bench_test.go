package net_test

import (
	"fmt"
	"testing"

	vnet "github.com/cube-runtime/cube/hypervisor/virtio/net"
	"github.com/cube-runtime/cube/hypervisor/virtio/virtiotest"
)

// The device's own cost per frame (fake backend, fake guest memory): an MTU
// frame against a TSO frame shows what segmentation offload saves the VMM.

func BenchmarkTx(b *testing.B) {
	for _, size := range []int{1514, 65000} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			be := newFake(true, allOffloads)
			be.discard = true
			g := newGuest(b, be, allFeatures)
			a := g.d.Alloc(vnet.HeaderLen + size)
			g.d.Mem.Put(a, withHeader(vnet.Header{}, frame(size, 0)))
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				g.d.AddChain(vnet.TxQueue, []virtiotest.Desc{{Addr: a, Len: uint32(vnet.HeaderLen + size)}})
				g.d.Kick(vnet.TxQueue)
				g.d.PopUsed(vnet.TxQueue)
			}
		})
	}
}

func BenchmarkRx(b *testing.B) {
	for _, size := range []int{1514, 65000} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			g := newGuest(b, newFake(true, allOffloads), allFeatures)
			in := withHeader(vnet.Header{}, frame(size, 0))
			n := (len(in) + 4095) / 4096
			bufs := make([]uint64, n)
			for i := range bufs {
				bufs[i] = g.d.Alloc(4096)
			}
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for _, a := range bufs {
					g.d.AddChain(vnet.RxQueue, []virtiotest.Desc{{Addr: a, Len: 4096, Write: true}})
				}
				if !g.dev.Deliver(in) {
					b.Fatal("waits")
				}
				if u := g.d.PopUsed(vnet.RxQueue); len(u) != n {
					b.Fatalf("used %d", len(u))
				}
			}
		})
	}
}
