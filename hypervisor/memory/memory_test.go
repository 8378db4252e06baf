package memory

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestX86Layout(t *testing.T) {
	if got := X86Layout(256 << 20); len(got) != 1 || got[0] != (Range{0, 256 << 20}) {
		t.Errorf("256 MiB: %v", got)
	}
	got := X86Layout(5 << 30)
	if len(got) != 2 || got[0] != (Range{0, 3 << 30}) || got[1] != (Range{4 << 30, 2 << 30}) {
		t.Errorf("5 GiB: %v", got)
	}
}

func TestAccessBounds(t *testing.T) {
	m, err := New([]Range{{0, 0x10000}, {0x20000, 0x1000}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.WriteUint32(0xfffc, 0xdeadbeef); err != nil {
		t.Fatal(err)
	}
	if v, err := m.ReadUint32(0xfffc); err != nil || v != 0xdeadbeef {
		t.Fatalf("read back %#x, %v", v, err)
	}
	bad := []struct{ gpa, n uint64 }{
		{0xfffd, 4},                 // straddles the end of region 0
		{0x10000, 1},                // in the gap
		{0x20fff, 2},                // straddles the end of region 1
		{^uint64(0) - 1, 4},         // wraps
		{0, 0x10001},                // too long
		{0x20000, ^uint64(0) - 100}, // huge length
	}
	for _, b := range bad {
		if _, err := m.Slice(b.gpa, b.n); !errors.Is(err, ErrOutOfBounds) {
			t.Errorf("Slice(%#x, %#x) err = %v, want ErrOutOfBounds", b.gpa, b.n, err)
		}
	}
	if _, err := m.ReadAt(make([]byte, 2), -1); !errors.Is(err, ErrOutOfBounds) {
		t.Errorf("negative ReadAt: %v", err)
	}
}

func TestDirtyTracking(t *testing.T) {
	m, err := New([]Range{{0, 64 * PageSize * 2}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.WriteAt([]byte{1}, 3*PageSize+5)
	m.WriteAt(make([]byte, PageSize+2), 70*PageSize-1) // pages 69, 70, 71
	m.MarkDirty(127*PageSize, 1<<40)                   // clipped to the region
	d := m.Regions()[0].TakeDirty()
	want := []uint64{1 << 3, 1<<(69-64) | 1<<(70-64) | 1<<(71-64) | 1<<(127-64)}
	if d[0] != want[0] || d[1] != want[1] {
		t.Errorf("dirty = %#x, want %#x", d, want)
	}
	if d := m.Regions()[0].TakeDirty(); d[0] != 0 || d[1] != 0 {
		t.Errorf("TakeDirty did not clear: %#x", d)
	}
}

func TestFileBackedPrivate(t *testing.T) {
	p := filepath.Join(t.TempDir(), "mem")
	content := bytes.Repeat([]byte{0xab}, 2*PageSize)
	if err := os.WriteFile(p, content, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := New([]Range{{0, PageSize}, {0x100000, PageSize}}, Options{File: f, Private: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if v, _ := m.ReadUint32(0x100000); v != 0xabababab {
		t.Errorf("second region reads %#x", v)
	}
	m.WriteUint32(0, 1)
	onDisk, _ := os.ReadFile(p)
	if !bytes.Equal(onDisk, content) {
		t.Error("private mapping wrote through to the file")
	}
}

func TestNewRejectsBadRanges(t *testing.T) {
	for _, rs := range [][]Range{{{0, 100}}, {{0x10, PageSize}}, {{0, 2 * PageSize}, {PageSize, PageSize}}} {
		if m, err := New(rs, Options{}); err == nil {
			m.Close()
			t.Errorf("New(%v) succeeded", rs)
		}
	}
}

func TestHugePagesAligned(t *testing.T) {
	m, err := New([]Range{{0, 6 << 20}}, Options{HugePages: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r := m.Regions()[0]
	if r.HostAddr()%hugePageSize != 0 || len(r.Host) != 6<<20 {
		t.Fatalf("host %#x len %#x: want 2 MiB aligned, 6 MiB", r.HostAddr(), len(r.Host))
	}
	if err := m.WriteUint64(6<<20-8, 42); err != nil {
		t.Fatal(err)
	}
	if v, _ := m.ReadUint64(6<<20 - 8); v != 42 {
		t.Errorf("read back %d", v)
	}
}
