package memory

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestHugeTLBRefusesWhatItCannotBack(t *testing.T) {
	for _, rs := range [][]Range{
		{{0, 3 << 20}},                     // 3 MiB: an odd number of MiB
		{{0, 2 << 20}, {5 << 20, 2 << 20}}, // second range not 2 MiB aligned
	} {
		m, err := New(rs, Options{HugeTLB: true})
		if err == nil {
			m.Close()
			t.Fatalf("New(%v, hugetlb) succeeded", rs)
		}
		if !errors.Is(err, ErrHugeTLBSize) || !strings.Contains(err.Error(), "even number of MiB") {
			t.Errorf("New(%v, hugetlb): %v", rs, err)
		}
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "mem"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if m, err := New([]Range{{0, 2 << 20}}, Options{HugeTLB: true, File: f}); err == nil {
		m.Close()
		t.Error("hugetlb over a file succeeded")
	}
}

func TestReadHugePool(t *testing.T) {
	dir := t.TempDir()
	for name, v := range map[string]string{"nr_hugepages": "200\n", "free_hugepages": "150\n", "resv_hugepages": "20\n"} {
		os.WriteFile(filepath.Join(dir, name), []byte(v), 0o644)
	}
	if p := readHugePool(dir); p != (hugePool{total: 200, free: 150, reserved: 20, ok: true}) {
		t.Errorf("pool %+v", p)
	}
	os.Remove(filepath.Join(dir, "resv_hugepages"))
	if p := readHugePool(dir); p.ok {
		t.Errorf("pool without resv_hugepages: %+v", p)
	}
}

func TestHugeTLBShortMessage(t *testing.T) {
	ranges := X86Layout(256 << 20) // 128 pages
	cases := []struct {
		pool hugePool
		want []string
	}{
		{hugePool{total: 100, free: 90, reserved: 10, ok: true},
			[]string{"needs 128 2 MiB pages", "has 80 free", "vm.nr_hugepages 100", "by at least 48", "sysctl -w vm.nr_hugepages=148"}},
		{hugePool{ok: true}, []string{"needs 128 2 MiB pages", "has 0 free", "sysctl -w vm.nr_hugepages=128"}},
		{hugePool{total: 300, free: 300, ok: true}, []string{"has 300 free", "cgroup"}},
		{hugePool{}, []string{"needs 128 free 2 MiB pages", "unreadable", "vm.nr_hugepages"}},
	}
	for _, c := range cases {
		err := hugeTLBShort(ranges, c.pool, unix.ENOMEM)
		if !errors.Is(err, unix.ENOMEM) {
			t.Errorf("%+v: %v does not wrap ENOMEM", c.pool, err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: %q lacks %q", c.pool, err, w)
			}
		}
	}
}

// TestHugeTLBMapsOrSaysWhy maps 4 MiB of hugetlb memory. Where the pool has
// the pages (test host runs that raise vm.nr_hugepages), the mapping is
// 2 MiB aligned, usable and populated 2 MiB at a time; where it is short
// (the default pool is empty), the error names the need and the fix.
func TestHugeTLBMapsOrSaysWhy(t *testing.T) {
	m, err := New([]Range{{0, 4 << 20}}, Options{HugeTLB: true})
	if err != nil {
		if !errors.Is(err, unix.ENOMEM) || !strings.Contains(err.Error(), "needs 2 2 MiB pages") ||
			!strings.Contains(err.Error(), "vm.nr_hugepages") {
			t.Fatalf("hugetlb map failed without saying why: %v", err)
		}
		t.Logf("pool short here: %v", err)
		return
	}
	defer m.Close()
	r := m.Regions()[0]
	if r.HostAddr()%HugeTLBPageSize != 0 || len(r.Host) != 4<<20 {
		t.Fatalf("host %#x len %#x: want 2 MiB aligned, 4 MiB", r.HostAddr(), len(r.Host))
	}
	if err := m.WriteUint64(4<<20-8, 42); err != nil {
		t.Fatal(err)
	}
	if v, _ := m.ReadUint64(4<<20 - 8); v != 42 {
		t.Errorf("read back %d", v)
	}
	// Touched: the second 2 MiB page is populated in every 4 KiB of it.
	pop, err := PopulatedPages(r.Host)
	if err != nil {
		t.Fatal(err)
	}
	if pop[512/64] != ^uint64(0) || pop[1023/64] != ^uint64(0) || pop[0] != 0 {
		t.Errorf("populated pages of a touched second huge page: %#x", pop)
	}
}
