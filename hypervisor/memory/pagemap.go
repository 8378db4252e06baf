package memory

import (
	"encoding/binary"
	"fmt"
	"os"
	"unsafe"
)

// pagemap bits (Documentation/admin-guide/mm/pagemap.rst).
const (
	pagemapPresent = 1 << 63
	pagemapSwapped = 1 << 62
)

// PopulatedPages returns one bit per page of host (which must be page
// aligned): set where this process's page tables hold the page or it is
// swapped out. For anonymous private memory a clear bit is a page nothing
// ever wrote (it reads as zero), so a full snapshot can skip it without
// reading it — reading would fault it in. It is wrong for file-backed
// memory, whose unfaulted pages hold the file's data. Hugetlb memory is
// reported per 4 KiB too: every page of a 2 MiB page the guest touched is
// set.
func PopulatedPages(host []byte) ([]uint64, error) {
	if len(host) == 0 {
		return nil, nil
	}
	addr := uintptr(unsafe.Pointer(&host[0]))
	if addr%PageSize != 0 {
		return nil, fmt.Errorf("populated pages: %#x is not page aligned", addr)
	}
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return nil, fmt.Errorf("populated pages: %w", err)
	}
	defer f.Close()
	pages := (len(host) + PageSize - 1) / PageSize
	out := make([]uint64, (pages+63)/64)
	buf := make([]byte, 8*4096)
	for p := 0; p < pages; {
		n := min(pages-p, len(buf)/8)
		b := buf[:n*8]
		if _, err := f.ReadAt(b, int64(addr/PageSize+uintptr(p))*8); err != nil {
			return nil, fmt.Errorf("populated pages: read pagemap: %w", err)
		}
		for i := range n {
			if binary.NativeEndian.Uint64(b[i*8:])&(pagemapPresent|pagemapSwapped) != 0 {
				out[(p+i)/64] |= 1 << ((p + i) % 64)
			}
		}
		p += n
	}
	return out, nil
}
