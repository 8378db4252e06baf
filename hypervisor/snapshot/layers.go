package snapshot

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// maxChain bounds an incremental chain: a child of a snapshot with this
// many memory layers is refused (validate allows 4096 layers in all).
const maxChain = 4000

// ChildLayers returns s's memory layers as an incremental child beside s
// lists them first: each of s's own files becomes ../BASE/NAME, names that
// already point at a sibling stay.
func (s *Snapshot) ChildLayers() ([]MemoryLayer, error) {
	base := filepath.Base(s.Dir)
	var out []MemoryLayer
	for _, l := range s.Manifest.Memory {
		out = append(out, MemoryLayer{File: siblingPath(base, l.File), Size: l.Size, Bitmap: siblingPath(base, l.Bitmap)})
	}
	if len(out) >= maxChain {
		return nil, fmt.Errorf("chain of %d layers is too long (take a full snapshot)", len(out))
	}
	return out, nil
}

// siblingPath rewrites a layer file name of snapshot base for a sibling.
func siblingPath(base, name string) string {
	if name == "" || filepath.Base(name) != name {
		return name // already ../other/name, or empty
	}
	return "../" + base + "/" + name
}

// WriteDiffLayer writes a diff memory layer into mem (the pages set in
// dirty, see WriteDiff) and its bitmap file (BitmapName), and returns the
// bytes of memory written.
func (w *Writer) WriteDiffLayer(mem *os.File, regions [][]byte, dirty []uint64) (int64, error) {
	n, err := WriteDiff(mem, regions, dirty)
	if err != nil {
		return n, err
	}
	bf, err := w.CreateFile(BitmapName)
	if err != nil {
		return n, err
	}
	defer bf.Close()
	if _, err := bf.Write(EncodeBitmap(dirty)); err != nil {
		return n, fmt.Errorf("write bitmap: %w", err)
	}
	return n, nil
}

// Bitmap reads and decodes memory layer i's bitmap (nil for a full layer),
// checking its size against the layer's.
func (s *Snapshot) Bitmap(i int) ([]uint64, error) {
	if i < 0 || i >= len(s.Manifest.Memory) {
		return nil, fmt.Errorf("memory layer %d of %d: %w", i, len(s.Manifest.Memory), ErrCorrupt)
	}
	ml := s.Manifest.Memory[i]
	if ml.Bitmap == "" {
		return nil, nil
	}
	f, err := os.Open(s.Path(ml.Bitmap))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	want := BitmapBytes(ml.Size)
	b, err := io.ReadAll(io.LimitReader(f, want+1)) // one more: a longer file is caught
	if err != nil {
		return nil, err
	}
	if int64(len(b)) != want {
		return nil, fmt.Errorf("bitmap of %d bytes: %w", len(b), ErrTruncated)
	}
	return DecodeBitmap(b)
}
