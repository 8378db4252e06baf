package memory

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestPopulatedPages(t *testing.T) {
	const pages = 200
	b, err := unix.Mmap(-1, 0, pages*PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	// No huge pages here: one write must populate one page, not 512.
	unix.Madvise(b, unix.MADV_NOHUGEPAGE)
	written := map[int]bool{3: true, 64: true, 130: true, 199: true}
	for p := range written {
		b[p*PageSize+5] = 1
	}
	got, err := PopulatedPages(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != (pages+63)/64 {
		t.Fatalf("%d words for %d pages", len(got), pages)
	}
	for p := 0; p < len(got)*64; p++ {
		if set := got[p/64]&(1<<(p%64)) != 0; set != written[p] {
			t.Errorf("page %d: populated=%v, written=%v", p, set, written[p])
		}
	}
	if _, err := PopulatedPages(b[1:]); err == nil {
		t.Error("unaligned memory accepted")
	}
}
