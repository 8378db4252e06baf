package snapshot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
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
	return writeRegions(f, regions, nil)
}

// WriteDiff writes only the pages set in dirty (one bit per page over the
// regions back to back) at their offsets, and returns the bytes written.
func WriteDiff(f *os.File, regions [][]byte, dirty []uint64) (written int64, err error) {
	return writeRegions(f, regions, func(page int64) bool {
		w := page / 64
		return w < int64(len(dirty)) && dirty[w]&(1<<(page%64)) != 0
	})
}

// writeRegions writes the regions back to back with writePages (keep nil:
// every page), then sizes f to the whole of guest RAM.
func writeRegions(f *os.File, regions [][]byte, keep func(page int64) bool) (written int64, err error) {
	var off int64
	for _, r := range regions {
		n, err := writePages(f, r, off, keep)
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

// RewritePages brings a memory file written earlier (a pre-copy of memory
// that kept changing) up to date: every page set in dirty is written again
// at its offset. A dirty page that is all zero now is punched out of the
// file (where the filesystem cannot punch holes, zeros are written): the
// file may hold that page's older, non-zero contents, and a full layer is
// read whole. Pages not set in dirty are left as they are. It returns the
// bytes of non-zero pages written.
func RewritePages(f *os.File, regions [][]byte, dirty []uint64) (written int64, err error) {
	var base int64 // global page number of the region's first page
	for _, r := range regions {
		pages := (int64(len(r)) + PageSize - 1) / PageSize
		for p := int64(0); p < pages; {
			g := base + p
			if g/64 >= int64(len(dirty)) {
				return written, nil
			}
			if dirty[g/64]&(1<<(g%64)) == 0 {
				p++
				continue
			}
			// A run of dirty pages that are all zero, or all not.
			zero := isZero(r[p*PageSize : min((p+1)*PageSize, int64(len(r)))])
			e := p + 1
			for e < pages && e-p < 2048 {
				ge := base + e
				if ge/64 >= int64(len(dirty)) || dirty[ge/64]&(1<<(ge%64)) == 0 ||
					isZero(r[e*PageSize:min((e+1)*PageSize, int64(len(r)))]) != zero {
					break
				}
				e++
			}
			lo, hi := p*PageSize, min(e*PageSize, int64(len(r)))
			off := base*PageSize + lo
			if zero {
				if err := zeroRange(f, off, hi-lo); err != nil {
					return written, err
				}
			} else {
				if _, err := f.WriteAt(r[lo:hi], off); err != nil {
					return written, fmt.Errorf("memory file: %w", err)
				}
				written += hi - lo
			}
			p = e
		}
		base += pages
	}
	return written, nil
}

// zeroPage is what zeroRange writes where holes cannot be punched.
var zeroPage [PageSize]byte

// zeroRange makes [off, off+n) of f read as zero: a hole if the
// filesystem can punch one, else written zeros.
func zeroRange(f *os.File, off, n int64) error {
	err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
		return fmt.Errorf("memory file: punch hole: %w", err)
	}
	for end := off + n; off < end; {
		c := min(end-off, PageSize)
		if _, err := f.WriteAt(zeroPage[:c], off); err != nil {
			return fmt.Errorf("memory file: %w", err)
		}
		off += c
	}
	return nil
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
