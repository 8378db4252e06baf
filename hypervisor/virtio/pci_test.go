package virtio_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/hypervisor/virtio"
	"github.com/cube-runtime/cube/hypervisor/virtio/rng"
	"github.com/cube-runtime/cube/hypervisor/virtio/virtiotest"
)

const feats = virtio.FVersion1 | virtio.FRingIndirectDesc

func ready(t *testing.T, dirty virtio.DirtyTracker) *virtiotest.Driver {
	t.Helper()
	d := virtiotest.NewDriver(t, rng.New(), dirty)
	if st := d.Init(feats, 16); st != 0xF {
		t.Fatalf("status after init %#x", st)
	}
	return d
}

func TestIdentityAndCapabilities(t *testing.T) {
	d := virtiotest.NewDriver(t, rng.New(), nil)
	d.Probe()
	if id := d.CfgRead32(0); id != 0x10441AF4 {
		t.Errorf("ids %#x", id)
	}
	if rev := d.CfgRead32(8) & 0xFF; rev != 1 {
		t.Errorf("revision %d", rev)
	}
	if ss := d.CfgRead32(0x2C); ss>>16 != 0x44 {
		t.Errorf("subsystem %#x", ss)
	}
	want := map[byte]uint32{1: virtio.CommonOffset, 2: virtio.NotifyOffset, 3: virtio.ISROffset, 4: virtio.DeviceOffset}
	for typ, off := range want {
		if d.Caps[typ] != off {
			t.Errorf("cap %d at %#x, want %#x", typ, d.Caps[typ], off)
		}
	}
	if _, ok := d.Caps[5]; !ok {
		t.Error("no VIRTIO_PCI_CAP_PCI_CFG")
	}
	// Device features: VERSION_1 in the high word.
	d.Write(virtio.CommonOffset, 4, 1)
	if f := d.Read(virtio.CommonOffset+4, 4); f&1 == 0 {
		t.Errorf("device features hi %#x lack VERSION_1", f)
	}
	d.Write(virtio.CommonOffset, 4, 7)
	if f := d.Read(virtio.CommonOffset+4, 4); f != 0 {
		t.Errorf("feature word 7 = %#x", f)
	}
	if n := d.Read(virtio.CommonOffset+0x12, 2); n != 1 {
		t.Errorf("num_queues %d", n)
	}
}

func TestFeaturesOKNeedsVersion1(t *testing.T) {
	d := virtiotest.NewDriver(t, rng.New(), nil)
	if st := d.Init(virtio.FRingIndirectDesc, 16); st&8 != 0 {
		t.Fatalf("FEATURES_OK accepted without VERSION_1: %#x", st)
	}
	// DRIVER_OK without FEATURES_OK does not activate.
	d.Write(virtio.CommonOffset+0x14, 1, 1|2|4)
	if st := d.Status(); st&4 != 0 {
		t.Fatalf("DRIVER_OK without FEATURES_OK: %#x", st)
	}
	// Unoffered feature bits are dropped.
	if st := d.Init(feats|1<<40, 16); st != 0xF {
		t.Fatalf("status %#x", st)
	}
	if got := d.Tr.NegotiatedFeatures(); got != feats {
		t.Errorf("negotiated %#x, want %#x", got, feats)
	}
}

func TestRNGRequestAndInterrupt(t *testing.T) {
	dirty := virtio.NewDirtyBitmap(virtiotest.MemSize)
	d := ready(t, dirty)
	dirty.Drain()
	a, b := d.Alloc(100), d.Alloc(5000)
	head := d.AddChain(0, []virtiotest.Desc{{Addr: a, Len: 100, Write: true}, {Addr: b, Len: 5000, Write: true}})
	d.Kick(0)
	used := d.PopUsed(0)
	if len(used) != 1 || used[0].ID != uint32(head) || used[0].Len != 5100 {
		t.Fatalf("used %+v", used)
	}
	if bytes.Equal(d.Mem.Bytes(b, 5000), make([]byte, 5000)) {
		t.Error("buffer not filled")
	}
	if n := d.MSI.Count(virtiotest.VectorData(0)); n != 1 {
		t.Errorf("%d interrupts on vector 0", n)
	}
	// The device's writes are in the dirty record: both buffers and the used ring.
	_, _, _, usedRing := d.QueueLayout(0)
	for _, gpa := range []uint64{a, b, b + 4999, usedRing} {
		if !dirty.IsDirty(gpa / virtio.PageSize) {
			t.Errorf("page of %#x not marked dirty", gpa)
		}
	}
	// Indirect chain.
	c := d.Alloc(64)
	d.AddIndirect(0, []virtiotest.Desc{{Addr: c, Len: 32, Write: true}, {Addr: c + 32, Len: 32, Write: true}})
	d.Kick(0)
	if used := d.PopUsed(0); len(used) != 1 || used[0].Len != 64 {
		t.Fatalf("indirect used %+v", used)
	}
}

func TestMalformedChainsAreSkipped(t *testing.T) {
	d := ready(t, nil)
	size, desc, _, _ := d.QueueLayout(0)
	buf := d.Alloc(16)
	// Loop: 5 -> 6 -> 5.
	d.PutDesc(desc, 5, buf, 8, 1|2, 6)
	d.PutDesc(desc, 6, buf, 8, 1|2, 5)
	d.Publish(0, 5)
	// Next index out of range.
	d.PutDesc(desc, 7, buf, 8, 1|2, size+3)
	d.Publish(0, 7)
	// Readable after writable.
	d.PutDesc(desc, 8, buf, 8, 1|2, 9)
	d.PutDesc(desc, 9, buf, 8, 0, 0)
	d.Publish(0, 8)
	// Indirect table with bad length, and a nested indirect.
	d.PutDesc(desc, 10, buf, 17, 4, 0)
	d.Publish(0, 10)
	tbl := d.Alloc(32)
	d.PutDesc(tbl, 0, tbl, 16, 4, 0)
	d.PutDesc(desc, 11, tbl, 16, 4, 0)
	d.Publish(0, 11)
	// Buffer outside guest memory: completes with 0 bytes written.
	d.PutDesc(desc, 12, 1<<40, 64, 2, 0)
	d.Publish(0, 12)
	// Then a good one.
	d.PutDesc(desc, 13, buf, 16, 2, 0)
	d.Publish(0, 13)
	d.Kick(0)
	used := d.PopUsed(0)
	if len(used) != 7 {
		t.Fatalf("used %+v", used)
	}
	for i, u := range used[:6] {
		if u.Len != 0 {
			t.Errorf("malformed chain %d (head %d) used len %d", i, u.ID, u.Len)
		}
	}
	if used[6].ID != 13 || used[6].Len != 16 {
		t.Errorf("good chain %+v", used[6])
	}
	if st := d.Status(); st&virtio.StatusNeedsReset != 0 {
		t.Errorf("status %#x: chain errors must not need reset", st)
	}
}

func TestCorruptRingNeedsReset(t *testing.T) {
	d := ready(t, nil)
	d.SetAvailIdx(0, 1000) // far more than queue size ahead
	d.Kick(0)
	if st := d.Status(); st&virtio.StatusNeedsReset == 0 {
		t.Fatalf("status %#x lacks NEEDS_RESET", st)
	}
	if n := d.MSI.Count(virtiotest.VectorData(d.ConfigVector())); n != 1 {
		t.Errorf("%d config interrupts", n)
	}
	gen := d.Read(virtio.CommonOffset+0x15, 1)
	if gen == 0 {
		t.Error("config generation not bumped")
	}
	// A reset and a fresh init recover the device.
	if st := d.Init(feats, 16); st != 0xF {
		t.Fatalf("re-init status %#x", st)
	}
	a := d.Alloc(8)
	d.AddChain(0, []virtiotest.Desc{{Addr: a, Len: 8, Write: true}})
	d.Kick(0)
	if used := d.PopUsed(0); len(used) != 1 || used[0].Len != 8 {
		t.Fatalf("after reset used %+v", used)
	}
}

func TestQueueRegisterValidation(t *testing.T) {
	d := virtiotest.NewDriver(t, rng.New(), nil)
	d.Probe()
	c := uint64(virtio.CommonOffset)
	d.Write(c+0x14, 1, 1|2)
	d.Write(c+0x16, 2, 0)
	for _, bad := range []uint64{0, 3, 512, 0xFFFF} {
		d.Write(c+0x18, 2, bad)
		if got := d.Read(c+0x18, 2); got != rng.QueueSize {
			t.Errorf("queue size %d accepted (reads %d)", bad, got)
		}
	}
	d.Write(c+0x1A, 2, 99) // beyond the MSI-X table
	if got := d.Read(c+0x1A, 2); got != virtio.NoVector {
		t.Errorf("vector readback %#x, want NO_VECTOR", got)
	}
	// Misaligned ring refuses to enable.
	d.Write(c+0x20, 8, 0x10008)
	d.Write(c+0x1C, 2, 1)
	if d.Read(c+0x1C, 2) != 0 {
		t.Error("misaligned queue enabled")
	}
	// Wrapping ring refuses to enable.
	d.Write(c+0x20, 8, 0xFFFF_FFFF_FFFF_FF00)
	d.Write(c+0x1C, 2, 1)
	if d.Read(c+0x1C, 2) != 0 {
		t.Error("wrapping queue enabled")
	}
	// Nonexistent queue reads size 0.
	d.Write(c+0x16, 2, 5)
	if d.Read(c+0x18, 2) != 0 {
		t.Error("queue 5 has a size")
	}
	// Odd-width and out-of-range accesses do not panic.
	for off := uint64(0); off < 0x40; off++ {
		for _, n := range []int{1, 2, 4, 8} {
			d.Write(c+off, n, 0xFFFFFFFFFFFFFFFF)
			d.Read(c+off, n)
		}
	}
	for _, off := range []uint64{virtio.ISROffset + 1, virtio.NotifyOffset + 0xFFC, virtio.BARSize - 1} {
		d.Write(off, 1, 1)
		d.Read(off, 1)
	}
}

func TestEventIdxSuppressesInterrupts(t *testing.T) {
	d := virtiotest.NewDriver(t, rng.New(), nil)
	if st := d.Init(feats|virtio.FRingEventIdx, 16); st != 0xF {
		t.Fatalf("status %#x", st)
	}
	size, _, avail, used := d.QueueLayout(0)
	var b [2]byte
	// used_event = 2: interrupt only when used idx passes 2.
	binary.LittleEndian.PutUint16(b[:], 2)
	d.Mem.Put(avail+4+2*uint64(size), b[:])
	buf := d.Alloc(8)
	for i := 0; i < 4; i++ {
		d.AddChain(0, []virtiotest.Desc{{Addr: buf, Len: 8, Write: true}})
		d.Kick(0)
	}
	if n := d.MSI.Count(virtiotest.VectorData(0)); n != 1 {
		t.Errorf("%d interrupts for 4 requests with used_event 2, want 1", n)
	}
	// avail_event tells the driver where to kick next.
	if ev := binary.LittleEndian.Uint16(d.Mem.Bytes(used+4+8*uint64(size), 2)); ev != 4 {
		t.Errorf("avail_event %d, want 4", ev)
	}
}

func TestNoInterruptFlag(t *testing.T) {
	d := ready(t, nil)
	_, _, avail, _ := d.QueueLayout(0)
	d.Mem.Put(avail, []byte{1, 0})
	buf := d.Alloc(8)
	d.AddChain(0, []virtiotest.Desc{{Addr: buf, Len: 8, Write: true}})
	d.Kick(0)
	if len(d.PopUsed(0)) != 1 || d.MSI.Count(virtiotest.VectorData(0)) != 0 {
		t.Error("interrupt despite VIRTQ_AVAIL_F_NO_INTERRUPT")
	}
}

func TestPCICfgWindow(t *testing.T) {
	d := virtiotest.NewDriver(t, rng.New(), nil)
	d.Probe()
	var capOff uint32
	for ptr := d.CfgRead32(0x34) & 0xFF; ptr != 0; ptr = (d.CfgRead32(ptr) >> 8) & 0xFF {
		if h := d.CfgRead32(ptr); h&0xFF == 9 && byte(h>>24) == 5 {
			capOff = ptr
		}
	}
	if capOff == 0 {
		t.Fatal("no pci cfg cap")
	}
	// Window onto common cfg num_queues (offset 0x12, 2 bytes)... use a dword at 0x10.
	d.CfgWrite32(capOff+4, 0) // bar 0
	d.CfgWrite32(capOff+8, 0x10)
	d.CfgWrite32(capOff+12, 4)
	v := d.CfgRead32(capOff + 16)
	if v>>16 != 1 {
		t.Errorf("num_queues via pci_cfg window %#x", v)
	}
}

func TestStateRoundTrip(t *testing.T) {
	d := ready(t, nil)
	buf := d.Alloc(8)
	d.AddChain(0, []virtiotest.Desc{{Addr: buf, Len: 8, Write: true}})
	d.Kick(0)
	d.PopUsed(0)
	st := d.Tr.State()
	if !st.Queues[0].Ready || st.Queues[0].LastAvail != 1 || st.Queues[0].UsedIdx != 1 {
		t.Fatalf("queue state %+v", st.Queues[0])
	}
	// The state is plain data: it survives a serialization round trip.
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	st = virtio.TransportState{}
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	// A new transport over the same memory continues where the old one stopped.
	dev2 := rng.New()
	tr2, err := virtio.NewPCI(dev2, virtio.PCIOptions{Mem: d.Mem, MSI: d.MSI})
	if err != nil {
		t.Fatal(err)
	}
	if err := dev2.Restore(rng.State{Version: snapshot.Version}); err != nil {
		t.Fatal(err)
	}
	if err := tr2.Restore(st); err != nil {
		t.Fatal(err)
	}
	if tr2.Status() != 0xF || tr2.NegotiatedFeatures() != feats {
		t.Fatalf("restored status %#x features %#x", tr2.Status(), tr2.NegotiatedFeatures())
	}
	// The restored transport is paused; Resume processes what the guest queued.
	d.AddChain(0, []virtiotest.Desc{{Addr: buf, Len: 8, Write: true}})
	if !tr2.Paused() || len(d.PopUsed(0)) != 0 {
		t.Fatal("restored transport processed queues before Resume")
	}
	tr2.Resume()
	if used := d.PopUsed(0); len(used) != 1 || used[0].Len != 8 {
		t.Fatalf("used after restore %+v", used)
	}
	bad := st
	bad.Version = 7
	if err := tr2.Restore(bad); err == nil {
		t.Error("unknown version accepted")
	}
	bad = st
	bad.Queues = append([]virtio.QueueState{}, st.Queues...)
	bad.Queues[0].Size = 3
	if err := tr2.Restore(bad); err == nil {
		t.Error("bad queue size accepted")
	}
	bad = st
	bad.DeviceID = virtio.IDBlock
	if err := tr2.Restore(bad); err == nil {
		t.Error("wrong device id accepted")
	}
}

func TestPauseDefersKicks(t *testing.T) {
	d := ready(t, nil)
	d.Tr.Pause()
	buf := d.Alloc(8)
	d.AddChain(0, []virtiotest.Desc{{Addr: buf, Len: 8, Write: true}})
	d.Kick(0)
	if u := d.PopUsed(0); len(u) != 0 {
		t.Fatalf("paused device processed %+v", u)
	}
	d.Tr.Resume()
	if u := d.PopUsed(0); len(u) != 1 {
		t.Fatalf("kick not replayed on resume: %+v", u)
	}
	d.Tr.Resume() // idempotent
}

type line struct{ level []bool }

func (l *line) SetLevel(high bool) error { l.level = append(l.level, high); return nil }

func TestINTxWhenMSIXDisabled(t *testing.T) {
	irq := &line{}
	d := virtiotest.NewDriverOpts(t, rng.New(), virtio.PCIOptions{INTx: irq, Class: 0xFF})
	if pin := d.CfgRead32(0x3C) >> 8 & 0xFF; pin != 1 {
		t.Fatalf("interrupt pin %d", pin)
	}
	if st := d.Init(feats, 16); st != 0xF {
		t.Fatalf("status %#x", st)
	}
	// Turn MSI-X off again (Probe enabled it): find the capability.
	for ptr := d.CfgRead32(0x34) & 0xFF; ptr != 0; ptr = (d.CfgRead32(ptr) >> 8) & 0xFF {
		if h := d.CfgRead32(ptr); h&0xFF == 0x11 {
			d.CfgWrite32(ptr, h&^(1<<31))
		}
	}
	buf := d.Alloc(8)
	d.AddChain(0, []virtiotest.Desc{{Addr: buf, Len: 8, Write: true}})
	d.Kick(0)
	if len(irq.level) == 0 || !irq.level[len(irq.level)-1] {
		t.Fatalf("INTx not asserted: %v", irq.level)
	}
	if isr := d.Read(virtio.ISROffset, 1); isr != 1 {
		t.Errorf("ISR %#x, want queue bit", isr)
	}
	if irq.level[len(irq.level)-1] {
		t.Error("ISR read did not deassert INTx")
	}
	if isr := d.Read(virtio.ISROffset, 1); isr != 0 {
		t.Errorf("ISR not cleared by read: %#x", isr)
	}
	if d.MSI.Count(virtiotest.VectorData(0)) != 0 {
		t.Error("MSI sent while MSI-X disabled")
	}
}
