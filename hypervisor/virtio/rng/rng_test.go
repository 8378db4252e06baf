package rng_test

import (
	"bytes"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/virtio"
	"github.com/cube-runtime/cube/hypervisor/virtio/rng"
	"github.com/cube-runtime/cube/hypervisor/virtio/virtiotest"
)

func TestFillsBuffersWithDistinctRandomness(t *testing.T) {
	d := virtiotest.NewDriver(t, rng.New(), nil)
	if st := d.Init(virtio.FVersion1, 8); st != 0xF {
		t.Fatalf("status %#x", st)
	}
	a, b := d.Alloc(64), d.Alloc(64)
	d.AddChain(0, []virtiotest.Desc{{Addr: a, Len: 64, Write: true}})
	d.AddChain(0, []virtiotest.Desc{{Addr: b, Len: 64, Write: true}})
	d.Kick(0)
	used := d.PopUsed(0)
	if len(used) != 2 || used[0].Len != 64 || used[1].Len != 64 {
		t.Fatalf("used %+v", used)
	}
	x, y := d.Mem.Bytes(a, 64), d.Mem.Bytes(b, 64)
	if bytes.Equal(x, y) || bytes.Equal(x, make([]byte, 64)) {
		t.Error("buffers not filled with fresh randomness")
	}
	// A readable-only chain gets nothing written.
	d.AddChain(0, []virtiotest.Desc{{Addr: a, Len: 64}})
	d.Kick(0)
	if u := d.PopUsed(0); len(u) != 1 || u[0].Len != 0 {
		t.Errorf("readable chain used %+v", u)
	}
	// Oversized request is capped, not served in full.
	big := d.Alloc(1 << 20)
	d.AddChain(0, []virtiotest.Desc{{Addr: big, Len: 1 << 20, Write: true}})
	d.Kick(0)
	if u := d.PopUsed(0); len(u) != 1 || u[0].Len != 64<<10 {
		t.Errorf("big request used %+v", u)
	}
}

func TestStateVersion(t *testing.T) {
	d := rng.New()
	if err := d.Restore(d.State()); err != nil {
		t.Fatal(err)
	}
	if err := d.Restore(rng.State{Version: 9}); err == nil {
		t.Error("unknown version accepted")
	}
}
