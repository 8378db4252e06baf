package snapshot

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestDiffLayerChain: a full snapshot, an incremental child beside it that
// lists the parent's layers as ../full/…, its bitmap read back, and a
// grandchild whose inherited names stay as the child had them.
func TestDiffLayerChain(t *testing.T) {
	dir := t.TempDir()
	mem := make([]byte, 1<<20)
	mem[3*PageSize] = 3
	write := func(name string, layers []MemoryLayer, dirty []uint64) *Snapshot {
		t.Helper()
		w, err := Create(filepath.Join(dir, name), 0)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Abort()
		f, err := w.CreateFile(MemoryName)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if dirty == nil {
			_, err = WriteFull(f, [][]byte{mem})
		} else {
			_, err = w.WriteDiffLayer(f, [][]byte{mem}, dirty)
		}
		if err != nil {
			t.Fatal(err)
		}
		m := &Manifest{Shape: Shape{VCPUs: 1, MemoryMiB: 1}, Memory: layers}
		if err := w.Commit(m, []byte("{}")); err != nil {
			t.Fatal(err)
		}
		s, err := Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	full := write("full", []MemoryLayer{{File: MemoryName, Size: 1 << 20}}, nil)
	if bm, err := full.Bitmap(0); bm != nil || err != nil {
		t.Errorf("full layer's bitmap: %v, %v; want none", bm, err)
	}
	inherited, err := full.ChildLayers()
	if err != nil {
		t.Fatal(err)
	}
	if len(inherited) != 1 || inherited[0].File != "../full/memory.bin" || inherited[0].Bitmap != "" {
		t.Fatalf("child layers of a full snapshot: %+v", inherited)
	}
	dirty := make([]uint64, BitmapBytes(1<<20)/8)
	dirty[0] = 1 << 3
	mem[3*PageSize] = 4
	child := write("child", append(inherited, MemoryLayer{File: MemoryName, Size: 1 << 20, Bitmap: BitmapName}), dirty)
	bm, err := child.Bitmap(1)
	if err != nil || len(bm) != len(dirty) || bm[0] != dirty[0] {
		t.Fatalf("child's bitmap: %v, %v", bm, err)
	}
	grand, err := child.ChildLayers()
	if err != nil {
		t.Fatal(err)
	}
	want := []MemoryLayer{{File: "../full/memory.bin", Size: 1 << 20}, {File: "../child/memory.bin", Size: 1 << 20, Bitmap: "../child/memory.bitmap"}}
	if len(grand) != 2 || grand[0] != want[0] || grand[1] != want[1] {
		t.Fatalf("grandchild layers %+v, want %+v", grand, want)
	}
	// A bitmap cut short after Open is refused as truncated.
	if err := os.Truncate(child.Path(BitmapName), 4); err != nil {
		t.Fatal(err)
	}
	if _, err := child.Bitmap(1); !errors.Is(err, ErrTruncated) {
		t.Errorf("short bitmap: %v, want ErrTruncated", err)
	}
	if _, err := child.Bitmap(2); !errors.Is(err, ErrCorrupt) {
		t.Errorf("bitmap of a layer that does not exist: %v, want ErrCorrupt", err)
	}
}
