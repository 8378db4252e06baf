package checkpoint

import (
	"encoding/binary"
	"fmt"
	"os"
)

// PageSize is the memory layer granule.
const PageSize = 4096

// BitmapBytes is the size of a diff layer's bitmap for size bytes of RAM.
func BitmapBytes(size int64) int64 {
	pages := (size + PageSize - 1) / PageSize
	return (pages + 63) / 64 * 8
}

// WriteFull writes guest RAM (the regions back to back) to f. All-zero
// pages are left as holes: the file stays sparse and reads back as zero.
func WriteFull(f *os.File, regions [][]byte) (written int64, err error) {
	var off int64
	for _, r := range regions {
		n, err := writePages(f, r, off, nil)
		if err != nil {
			return written, err
		}
		written += n
		off += int64(len(r))
	}
	if err := f.Truncate(off); err != nil {
		return written, fmt.Errorf("memory file: %w", err)
	}
	return written, nil
}

// WriteDiff writes only the pages set in dirty (one bit per page over the
// regions back to back) at their offsets, and returns the bytes written.
func WriteDiff(f *os.File, regions [][]byte, dirty []uint64) (written int64, err error) {
	var off int64
	for _, r := range regions {
		n, err := writePages(f, r, off, func(page int64) bool {
			w := page / 64
			return w < int64(len(dirty)) && dirty[w]&(1<<(page%64)) != 0
		})
		if err != nil {
			return written, err
		}
		written += n
		off += int64(len(r))
	}
	if err := f.Truncate(off); err != nil {
		return written, fmt.Errorf("memory file: %w", err)
	}
	return written, nil
}

// writePages writes runs of pages of r at base+offset; include (nil: all)
// selects pages by global page number. Zero pages are skipped.
func writePages(f *os.File, r []byte, base int64, include func(page int64) bool) (int64, error) {
	var written int64
	n := int64(len(r))
	for start := int64(0); start < n; {
		// Find a run of wanted non-zero pages.
		for start < n && !wantPage(r, start, base, include) {
			start += PageSize
		}
		end := start
		for end < n && end-start < 8<<20 && wantPage(r, end, base, include) {
			end += PageSize
		}
		if end > start {
			if _, err := f.WriteAt(r[start:min(end, n)], base+start); err != nil {
				return written, fmt.Errorf("memory file: %w", err)
			}
			written += min(end, n) - start
		}
		start = end
	}
	return written, nil
}

func wantPage(r []byte, off, base int64, include func(int64) bool) bool {
	if include != nil && !include((base+off)/PageSize) {
		return false
	}
	return !isZero(r[off:min(off+PageSize, int64(len(r)))])
}

func isZero(p []byte) bool {
	for len(p) >= 8 {
		if binary.NativeEndian.Uint64(p) != 0 {
			return false
		}
		p = p[8:]
	}
	for _, b := range p {
		if b != 0 {
			return false
		}
	}
	return true
}

// EncodeBitmap and DecodeBitmap convert a dirty bitmap to its file form.
func EncodeBitmap(words []uint64) []byte {
	b := make([]byte, 0, len(words)*8)
	for _, w := range words {
		b = binary.LittleEndian.AppendUint64(b, w)
	}
	return b
}

func DecodeBitmap(b []byte) ([]uint64, error) {
	if len(b)%8 != 0 {
		return nil, fmt.Errorf("bitmap of %d bytes: %w", len(b), ErrCorrupt)
	}
	w := make([]uint64, len(b)/8)
	for i := range w {
		w[i] = binary.LittleEndian.Uint64(b[i*8:])
	}
	return w, nil
}

// Runs returns the [start, end) page ranges set in a bitmap, in order.
func Runs(words []uint64, pages int64) [][2]int64 {
	var out [][2]int64
	pages = min(pages, int64(len(words))*64)
	for p := int64(0); p < pages; {
		if words[p/64]&(1<<(p%64)) == 0 {
			if words[p/64] == 0 {
				p = (p/64 + 1) * 64
			} else {
				p++
			}
			continue
		}
		s := p
		for p < pages && words[p/64]&(1<<(p%64)) != 0 {
			p++
		}
		out = append(out, [2]int64{s, p})
	}
	return out
}
