package bus

import (
	"bytes"
	"testing"
)

type recorder struct {
	reads, writes []uint64
	last          []byte
}

func (r *recorder) Read(off uint64, d []byte) {
	r.reads = append(r.reads, off)
	for i := range d {
		d[i] = byte(off) + byte(i)
	}
}
func (r *recorder) Write(off uint64, d []byte) {
	r.writes = append(r.writes, off)
	r.last = append([]byte(nil), d...)
}

func TestDispatch(t *testing.T) {
	var b Bus
	a, c := &recorder{}, &recorder{}
	if err := b.Register(0x3f8, 8, "serial", a); err != nil {
		t.Fatal(err)
	}
	if err := b.Register(0x60, 1, "i8042-data", c); err != nil {
		t.Fatal(err)
	}
	if err := b.Register(0x3fc, 8, "overlap", c); err == nil {
		t.Fatal("overlapping registration accepted")
	}
	if err := b.Register(^uint64(0), 2, "wrap", c); err == nil {
		t.Fatal("wrapping registration accepted")
	}
	d := make([]byte, 2)
	if !b.Read(0x3fa, d) || !bytes.Equal(d, []byte{2, 3}) {
		t.Errorf("read 0x3fa = %v", d)
	}
	if !b.Write(0x3f8, []byte{'x'}) || a.writes[0] != 0 || a.last[0] != 'x' {
		t.Errorf("write not dispatched: %+v", a)
	}
	// Straddling the end of a range, and unclaimed addresses.
	if b.Read(0x3ff, d) || !bytes.Equal(d, []byte{0xff, 0xff}) {
		t.Errorf("straddling read claimed or not all-ones: %v", d)
	}
	if b.Write(0x61, []byte{1}) {
		t.Error("write to unclaimed port claimed")
	}
	if err := b.Unregister(0x3f8); err != nil {
		t.Fatal(err)
	}
	if b.Read(0x3f8, d[:1]) {
		t.Error("read after Unregister claimed")
	}
	if err := b.Unregister(0x1234); err == nil {
		t.Error("Unregister of nothing succeeded")
	}
}

func TestAccesses(t *testing.T) {
	var b Bus
	b.Register(0x3f8, 8, "serial", &recorder{})
	b.Register(0x60, 1, "i8042", &recorder{})
	b.Register(0xcf8, 8, "pci", &recorder{})
	d := make([]byte, 1)
	for range 3 {
		b.Write(0x3f8, d)
	}
	b.Read(0x60, d)
	b.Read(0x1234, d) // unclaimed: counted nowhere
	got := b.Accesses()
	if len(got) != 2 || got[0] != (Access{"serial", 0x3f8, 3}) || got[1] != (Access{"i8042", 0x60, 1}) {
		t.Errorf("Accesses = %+v", got)
	}
}
