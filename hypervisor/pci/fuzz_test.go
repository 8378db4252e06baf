package pci

import (
	"encoding/binary"
	"testing"
)

// FuzzConfigSpace drives the bus with an arbitrary sequence of config-space and
// BAR accesses (ports 0xCF8-0xCFF, ECAM, MMIO) and checks the invariants a guest
// must not be able to break: no panic, identity registers unchanged, BAR type
// bits unchanged, BAR addresses aligned to their size.
func FuzzConfigSpace(f *testing.F) {
	f.Add([]byte{0, 0xF8, 0x0C, 4, 0x10, 0x08, 0, 0x80, 0, 0xFC, 0x0C, 4, 0xFF, 0xFF, 0xFF, 0xFF})
	f.Add([]byte{2, 0x00, 0x80, 4, 0x40, 0, 0, 0, 3, 0x10, 0x80, 8, 1, 2, 3, 4, 5, 6, 7, 8})
	f.Add([]byte{1, 0x10, 0x80, 4, 0xFF, 0xFF, 0xFF, 0xFF, 1, 0x04, 0x80, 2, 0, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		b := NewBus(Window{Base: 0xC000_0000, Size: 0x1000_0000}, Window{Base: 0x1000, Size: 0x1000})
		d := newTestDev(t, &msiRecorder{})
		if _, err := b.Add(d); err != nil {
			t.Fatal(err)
		}
		for len(ops) >= 4 {
			kind, off := ops[0]%4, uint64(binary.LittleEndian.Uint16(ops[1:3]))
			n := int(ops[3]%8) + 1
			ops = ops[4:]
			data := make([]byte, n)
			copy(data, ops)
			if len(ops) >= n {
				ops = ops[n:]
			} else {
				ops = nil
			}
			switch kind {
			case 0: // port I/O in 0xCF8..0xCFF
				port := PortConfigAddress + uint16(off%8)
				if off&0x8000 != 0 {
					b.PIORead(port, data)
				} else {
					b.PIOWrite(port, data)
				}
			case 1: // config write to slot 1 through 0xCF8/0xCFC
				cf8(b, 1, uint32(off))
				b.PIOWrite(PortConfigData+uint16(off%4), data)
			case 2: // ECAM
				if off&0x8000 != 0 {
					b.ECAMRead(off|1<<15, data)
				} else {
					b.ECAMWrite(off|1<<15, data)
				}
			case 3: // MMIO anywhere near the window
				addr := 0xC000_0000 + off<<2
				if off&1 != 0 {
					b.MMIORead(addr, data)
				} else {
					b.MMIOWrite(addr, data)
				}
			}
		}
		if got := cfgRead32(b, 1, 0); got != 0x10421AF4 {
			t.Fatalf("identity changed: %#x", got)
		}
		if got := cfgRead32(b, 1, RegBAR0) & 0xF; got != 0x4 {
			t.Fatalf("bar0 type bits %#x", got)
		}
		if got := cfgRead32(b, 1, RegBAR0+8) & 0x3; got != 0x1 {
			t.Fatalf("bar2 type bits %#x", got)
		}
		if a := d.cfg.BARAddress(0); a%0x4000 != 0 {
			t.Fatalf("bar0 misaligned %#x", a)
		}
		for _, r := range b.Regions() {
			if r.Base+r.Size < r.Base {
				t.Fatalf("wrapping region %+v", r)
			}
		}
	})
}
