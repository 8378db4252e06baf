package pci

import (
	"encoding/binary"
	"sync"
	"testing"
)

// testDev is a function with one 64-bit memory BAR, one I/O BAR and MSI-X.
type testDev struct {
	cfg    *Config
	msix   *MSIX
	mu     sync.Mutex
	writes map[uint64][]byte
}

type msiRecorder struct {
	mu   sync.Mutex
	msgs [][2]uint64
}

func (r *msiRecorder) SignalMSI(addr uint64, data uint32) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, [2]uint64{addr, uint64(data)})
	return nil
}

func newTestDev(t testing.TB, sig MSISignaler) *testDev {
	cfg := NewConfig(Header{VendorID: 0x1AF4, DeviceID: 0x1042, Revision: 1, Class: 0xFF})
	if err := cfg.SetBAR(0, BARInfo{Kind: BARMem64, Size: 0x4000}); err != nil {
		t.Fatal(err)
	}
	if err := cfg.SetBAR(2, BARInfo{Kind: BARIO, Size: 0x20}); err != nil {
		t.Fatal(err)
	}
	m, err := NewMSIX(cfg, 3, 0, 0x2000, 0x3000, sig)
	if err != nil {
		t.Fatal(err)
	}
	return &testDev{cfg: cfg, msix: m, writes: map[uint64][]byte{}}
}

func (d *testDev) Config() *Config                  { return d.cfg }
func (d *testDev) ReadConfig(off uint64, p []byte)  { d.cfg.Read(off, p) }
func (d *testDev) WriteConfig(off uint64, p []byte) { d.cfg.Write(off, p); d.msix.ConfigWritten() }
func (d *testDev) ReadBAR(bar int, off uint64, p []byte) {
	switch {
	case bar == 0 && off >= 0x2000 && off < 0x3000:
		d.msix.TableRead(off-0x2000, p)
	case bar == 0 && off >= 0x3000:
		d.msix.PBARead(off-0x3000, p)
	default:
		for i := range p {
			p[i] = byte(off) + byte(i)
		}
	}
}
func (d *testDev) WriteBAR(bar int, off uint64, p []byte) {
	if bar == 0 && off >= 0x2000 && off < 0x3000 {
		d.msix.TableWrite(off-0x2000, p)
		return
	}
	d.mu.Lock()
	d.writes[uint64(bar)<<32|off] = append([]byte(nil), p...)
	d.mu.Unlock()
}

func cf8(b *Bus, slot int, reg uint32) {
	var v [4]byte
	binary.LittleEndian.PutUint32(v[:], 1<<31|uint32(slot)<<11|reg&0xFC)
	b.PIOWrite(PortConfigAddress, v[:])
}

func cfgRead32(b *Bus, slot int, reg uint32) uint32 {
	cf8(b, slot, reg)
	var v [4]byte
	b.PIORead(PortConfigData, v[:])
	return binary.LittleEndian.Uint32(v[:])
}

func cfgWrite32(b *Bus, slot int, reg uint32, val uint32) {
	cf8(b, slot, reg)
	var v [4]byte
	binary.LittleEndian.PutUint32(v[:], val)
	b.PIOWrite(PortConfigData, v[:])
}

func newBus(t testing.TB) (*Bus, *testDev, *msiRecorder) {
	b := NewBus(Window{Base: 0xC000_0000, Size: 0x1000_0000}, Window{Base: 0x1000, Size: 0x1000})
	rec := &msiRecorder{}
	d := newTestDev(t, rec)
	slot, err := b.Add(d)
	if err != nil {
		t.Fatal(err)
	}
	if slot != 1 {
		t.Fatalf("slot %d, want 1", slot)
	}
	return b, d, rec
}

func TestEnumerationViaCF8(t *testing.T) {
	b, _, _ := newBus(t)
	if got := cfgRead32(b, 0, 0); got != 0x0d578086 {
		t.Errorf("host bridge id %#x", got)
	}
	if got := cfgRead32(b, 0, 8) >> 8; got != 0x060000 {
		t.Errorf("host bridge class %#x", got)
	}
	if got := cfgRead32(b, 1, 0); got != 0x10421AF4 {
		t.Errorf("device id %#x", got)
	}
	for slot := 2; slot < MaxSlots; slot++ {
		if got := cfgRead32(b, slot, 0); got != 0xFFFFFFFF {
			t.Errorf("empty slot %d reads %#x", slot, got)
		}
	}
	// Disabled config address: data port reads all ones.
	var v [4]byte
	binary.LittleEndian.PutUint32(v[:], 0)
	b.PIOWrite(PortConfigAddress, v[:])
	b.PIORead(PortConfigData, v[:])
	if binary.LittleEndian.Uint32(v[:]) != 0xFFFFFFFF {
		t.Errorf("disabled access returned %x", v)
	}
	// Byte and word reads at sub-offsets of 0xCFC.
	cf8(b, 1, 0)
	var w [2]byte
	b.PIORead(PortConfigData+2, w[:])
	if binary.LittleEndian.Uint16(w[:]) != 0x1042 {
		t.Errorf("word read at 0xCFE = %x", w)
	}
	// Reading back the address register.
	cf8(b, 3, 0x40)
	b.PIORead(PortConfigAddress, v[:])
	if binary.LittleEndian.Uint32(v[:]) != 1<<31|3<<11|0x40 {
		t.Errorf("cf8 readback %x", v)
	}
}

func TestBARSizingAndRelocation(t *testing.T) {
	b, d, _ := newBus(t)
	base := cfgRead32(b, 1, RegBAR0)
	if base&0xF != 0x4 {
		t.Fatalf("bar0 low bits %#x, want 64-bit non-prefetchable", base&0xF)
	}
	if base&^0xF != 0xC000_0000 {
		t.Fatalf("bar0 assigned %#x", base)
	}
	rs := b.Regions()
	if len(rs) != 2 || rs[0].Base != 0xC000_0000 || rs[0].Size != 0x4000 || !rs[1].IO || rs[1].Base != 0x1000 {
		t.Fatalf("regions %+v", rs)
	}
	var remaps [][]Region
	b.OnRemap(func(r []Region) { remaps = append(remaps, r) })
	// Linux's sizing sequence: decode off, write ones, read, restore, decode on.
	cmd := cfgRead32(b, 1, RegCommand)
	cfgWrite32(b, 1, RegCommand, cmd&^0x3)
	cfgWrite32(b, 1, RegBAR0, 0xFFFFFFFF)
	cfgWrite32(b, 1, RegBAR0+4, 0xFFFFFFFF)
	lo, hi := cfgRead32(b, 1, RegBAR0), cfgRead32(b, 1, RegBAR0+4)
	size := ^(uint64(hi)<<32 | uint64(lo&^0xF)) + 1
	if size != 0x4000 || lo&0xF != 0x4 {
		t.Errorf("sized %#x (lo %#x hi %#x)", size, lo, hi)
	}
	cfgWrite32(b, 1, RegBAR0+8, 0xFFFFFFFF)
	if got := cfgRead32(b, 1, RegBAR0+8); got != 0xFFFFFFE1 {
		t.Errorf("io bar sizing %#x", got)
	}
	// Unimplemented BAR reads zero and stays zero.
	cfgWrite32(b, 1, RegBAR0+12, 0xFFFFFFFF)
	if got := cfgRead32(b, 1, RegBAR0+12); got != 0 {
		t.Errorf("unimplemented bar %#x", got)
	}
	// Move BAR0 to 0xD000_0000 and re-enable decoding.
	cfgWrite32(b, 1, RegBAR0, 0xD000_0000)
	cfgWrite32(b, 1, RegBAR0+4, 0)
	cfgWrite32(b, 1, RegBAR0+8, 0x2000)
	cfgWrite32(b, 1, RegCommand, cmd)
	if d.cfg.BARAddress(0) != 0xD000_0000 {
		t.Fatalf("bar0 at %#x", d.cfg.BARAddress(0))
	}
	if b.MMIOWrite(0xC000_0010, []byte{1}) {
		t.Error("old address still decodes")
	}
	if !b.MMIOWrite(0xD000_0010, []byte{7}) || d.writes[0x10][0] != 7 {
		t.Error("new address does not decode")
	}
	p := make([]byte, 4)
	if !b.MMIORead(0xD000_0004, p) || p[0] != 4 {
		t.Errorf("read %v", p)
	}
	// Accesses straddling the end of a BAR are not claimed.
	if b.MMIORead(0xD000_3FFE, make([]byte, 4)) {
		t.Error("straddling access claimed")
	}
	if len(remaps) == 0 {
		t.Error("no remap callback")
	}
	last := remaps[len(remaps)-1]
	if len(last) != 2 || last[0].Base != 0xD000_0000 || last[1].Base != 0x2000 {
		t.Errorf("last remap %+v", last)
	}
	if !b.PIOWrite(0x2004, []byte{9}) || d.writes[2<<32|4][0] != 9 {
		t.Error("io bar does not decode")
	}
}

func TestReadOnlyFields(t *testing.T) {
	b, _, _ := newBus(t)
	cfgWrite32(b, 1, 0, 0)
	cfgWrite32(b, 1, 8, 0)
	if got := cfgRead32(b, 1, 0); got != 0x10421AF4 {
		t.Errorf("vendor/device changed to %#x", got)
	}
	if got := cfgRead32(b, 1, 8); got != 0xFF000001 {
		t.Errorf("class/revision changed to %#x", got)
	}
	// Status capability bit set, cap pointer valid.
	st := cfgRead32(b, 1, RegCommand) >> 16
	if st&statusCapList == 0 {
		t.Error("no capability list bit")
	}
	ptr := cfgRead32(b, 1, RegCapPtr) & 0xFF
	if id := cfgRead32(b, 1, ptr) & 0xFF; id != CapIDMSIX {
		t.Errorf("cap at %#x has id %#x", ptr, id)
	}
}

func TestECAM(t *testing.T) {
	b, _, _ := newBus(t)
	p := make([]byte, 4)
	b.ECAMRead(1<<15, p)
	if binary.LittleEndian.Uint32(p) != 0x10421AF4 {
		t.Errorf("ecam id %x", p)
	}
	b.ECAMRead(1<<15|0x100, p)
	if binary.LittleEndian.Uint32(p) != 0 {
		t.Errorf("extended space %x", p)
	}
	b.ECAMRead(1<<15|1<<12, p) // function 1
	if binary.LittleEndian.Uint32(p) != 0xFFFFFFFF {
		t.Errorf("fn 1 %x", p)
	}
	b.ECAMWrite(1<<15|RegInterruptLine, []byte{11})
	if got := cfgRead32(b, 1, RegInterruptLine) & 0xFF; got != 11 {
		t.Errorf("interrupt line %d", got)
	}
}

func TestMSIXMaskingAndPending(t *testing.T) {
	b, d, rec := newBus(t)
	ptr := cfgRead32(b, 1, RegCapPtr) & 0xFF
	ctl := cfgRead32(b, 1, ptr)
	if n := (ctl>>16)&0x7FF + 1; n != 3 {
		t.Fatalf("table size %d", n)
	}
	if tbl := cfgRead32(b, 1, ptr+4); tbl != 0x2000 {
		t.Errorf("table offset/bir %#x", tbl)
	}
	if ok, _ := d.msix.Notify(0); ok {
		t.Error("notify with msi-x disabled reported delivery")
	}
	cfgWrite32(b, 1, ptr, ctl|msixCtrlEnable<<16|msixCtrlMask<<16)
	bar := uint64(0xC000_0000)
	w32 := func(off uint64, v uint32) {
		var p [4]byte
		binary.LittleEndian.PutUint32(p[:], v)
		b.MMIOWrite(bar+off, p[:])
	}
	r64 := func(off uint64) uint64 {
		var p [8]byte
		b.MMIORead(bar+off, p[:])
		return binary.LittleEndian.Uint64(p[:])
	}
	var changes []int
	d.msix.OnEntryChange(func(v int, e MSIXEntry) { changes = append(changes, v) })
	// Entry 1: address 0xFEE00000, data 0x41, unmasked; function still masked.
	w32(0x2010, 0xFEE0_0000)
	w32(0x2014, 0)
	w32(0x2018, 0x41)
	w32(0x201C, 0)
	if ok, err := d.msix.Notify(1); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if len(rec.msgs) != 0 {
		t.Fatal("delivered while function masked")
	}
	if r64(0x3000) != 2 {
		t.Errorf("pba %#x", r64(0x3000))
	}
	if len(changes) != 4 || changes[0] != 1 {
		t.Errorf("entry change callbacks %v", changes)
	}
	// Unmask the function: the pending message is delivered.
	cfgWrite32(b, 1, ptr, ctl|msixCtrlEnable<<16)
	if len(rec.msgs) != 1 || rec.msgs[0] != [2]uint64{0xFEE0_0000, 0x41} || r64(0x3000) != 0 {
		t.Fatalf("msgs %v pba %#x", rec.msgs, r64(0x3000))
	}
	// Entry 2 stays masked (reset state) and pends until unmasked.
	d.msix.Notify(2)
	if len(rec.msgs) != 1 || r64(0x3000) != 4 {
		t.Fatal("masked vector delivered")
	}
	w32(0x2020, 0xFEE0_1000)
	w32(0x2028, 0x42)
	w32(0x202C, 0)
	if len(rec.msgs) != 2 || rec.msgs[1] != [2]uint64{0xFEE0_1000, 0x42} {
		t.Fatalf("msgs %v", rec.msgs)
	}
	// Out-of-range and NoVector notifications are ignored.
	d.msix.Notify(3)
	d.msix.Notify(NoVector)
	if len(rec.msgs) != 2 {
		t.Error("out of range vector delivered")
	}
	// Unaligned and byte accesses to the table are ignored, reads of them are all ones.
	b.MMIOWrite(bar+0x2011, []byte{1, 2})
	if e, _ := d.msix.Entry(1); e.AddrLo != 0xFEE0_0000 {
		t.Errorf("unaligned write changed entry: %+v", e)
	}
	// State round trip.
	st := d.msix.State()
	d2 := newTestDev(t, rec)
	if err := d2.cfg.Restore(d.cfg.Bytes()); err != nil {
		t.Fatal(err)
	}
	if err := d2.msix.Restore(st); err != nil {
		t.Fatal(err)
	}
	if e, _ := d2.msix.Entry(2); e.Data != 0x42 || !d2.msix.Enabled() {
		t.Errorf("restored entry %+v enabled %v", e, d2.msix.Enabled())
	}
	st.Version = 99
	if err := d2.msix.Restore(st); err == nil {
		t.Error("restore accepted unknown version")
	}
}

func TestAddCapabilityOverflow(t *testing.T) {
	c := NewConfig(Header{VendorID: 1})
	for i := 0; ; i++ {
		if _, err := c.AddCapability(CapIDVendor, make([]byte, 30), nil); err != nil {
			if i < 5 {
				t.Fatalf("failed after %d caps: %v", i, err)
			}
			break
		}
		if i > 20 {
			t.Fatal("config space never filled up")
		}
	}
	// The chain is well-formed and terminates.
	p := c.Bytes()
	seen := 0
	for off := int(p[RegCapPtr]); off != 0; off = int(p[off+1]) {
		if off < 0x40 || off >= ConfigSize || seen > 48 {
			t.Fatalf("bad chain at %#x", off)
		}
		seen++
	}
}

func TestSetBARValidation(t *testing.T) {
	c := NewConfig(Header{})
	for _, tc := range []struct {
		i int
		b BARInfo
	}{
		{6, BARInfo{Kind: BARMem32, Size: 16}},
		{0, BARInfo{Kind: BARMem32, Size: 24}},
		{5, BARInfo{Kind: BARMem64, Size: 16}},
		{0, BARInfo{Kind: BARIO, Size: 512}},
		{0, BARInfo{Kind: BARMem32, Size: 8}},
	} {
		if err := c.SetBAR(tc.i, tc.b); err == nil {
			t.Errorf("SetBAR(%d, %+v) accepted", tc.i, tc.b)
		}
	}
	b := NewBus(Window{Base: 0xC000_0000, Size: 0x1000}, Window{})
	d := newTestDev(t, nil)
	if _, err := b.Add(d); err == nil {
		t.Error("bar larger than window accepted")
	}
}

func TestRescanAfterRestore(t *testing.T) {
	b, d, _ := newBus(t)
	cfgWrite32(b, 1, RegBAR0, 0xD000_0000) // the guest moves BAR0
	saved := d.cfg.Bytes()

	// Restore: a new bus places the device where Add would, then the saved
	// config moves it back; Rescan makes the bus decode the restored address.
	b2 := NewBus(Window{Base: 0xC000_0000, Size: 0x1000_0000}, Window{Base: 0x1000, Size: 0x1000})
	d2 := newTestDev(t, nil)
	if _, err := b2.Add(d2); err != nil {
		t.Fatal(err)
	}
	if err := d2.cfg.Restore(saved); err != nil {
		t.Fatal(err)
	}
	var seen []Region
	b2.OnRemap(func(r []Region) { seen = r })
	b2.Rescan()
	if !b2.MMIOWrite(0xD000_0010, []byte{1}) || b2.MMIOWrite(0xC000_0010, []byte{1}) {
		t.Error("restored BAR address not decoded")
	}
	if len(seen) == 0 || seen[0].Base != 0xD000_0000 {
		t.Errorf("remap callback %+v", seen)
	}
}
