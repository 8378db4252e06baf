package memory

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// HugeTLBPageSize is the size of the hugetlb pages guest RAM takes
// (Options.HugeTLB): x86's 2 MiB.
const HugeTLBPageSize = 2 << 20

// hugePoolDir is where the kernel shows the 2 MiB pool.
const hugePoolDir = "/sys/kernel/mm/hugepages/hugepages-2048kB"

// ErrHugeTLBSize is wrapped when a range cannot be backed by 2 MiB pages.
var ErrHugeTLBSize = errors.New("hugetlb guest RAM must be a whole number of 2 MiB pages")

// checkHugeTLB refuses what hugetlb memory cannot be: file-backed, or
// ranges that are not whole 2 MiB pages. Sizes are refused rather than
// rounded up: the guest would not see the rest, and every other check of
// a range (KVM slots, snapshots' files) is by its size.
func checkHugeTLB(ranges []Range, opt Options) error {
	if opt.File != nil {
		return errors.New("memory: hugetlb backs anonymous memory only, not a snapshot's file")
	}
	for i, r := range ranges {
		if r.GPA%HugeTLBPageSize != 0 || r.Size%HugeTLBPageSize != 0 {
			return fmt.Errorf("memory: range %d [%#x,+%#x): %w (give the guest an even number of MiB)",
				i, r.GPA, r.Size, ErrHugeTLBSize)
		}
	}
	return nil
}

// mmapHugeTLB maps size bytes (a multiple of 2 MiB) of private anonymous
// memory from the 2 MiB hugetlb pool. The kernel places it 2 MiB aligned,
// so KVM can map each page as one 2 MiB nested page (guest RAM regions
// start 2 MiB aligned too).
//
// No MAP_NORESERVE: with it the kernel would not reserve the pages, the
// map would succeed on a short pool and the guest would die of SIGBUS on
// the first page the pool cannot give. Without it the whole size is
// reserved now, and a short pool fails here with ENOMEM.
//
// Nothing may madvise this memory as if it were small or THP pages:
// MADV_HUGEPAGE does not apply, and MADV_DONTNEED, MADV_REMOVE or
// MADV_FREE would drop or fail on whole 2 MiB pages. The VMM calls none
// of them on guest RAM (mmapHuge's MADV_HUGEPAGE is the THP path only).
func mmapHugeTLB(size int) ([]byte, error) {
	return unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_HUGETLB|unix.MAP_HUGE_2MB)
}

// hugePool is the 2 MiB pool's state; ok is false when it could not be
// read (no hugetlb support, or no sysfs).
type hugePool struct {
	total, free, reserved int64
	ok                    bool
}

// readHugePool reads the pool from dir (hugePoolDir).
func readHugePool(dir string) hugePool {
	var p hugePool
	for _, f := range []struct {
		name string
		v    *int64
	}{{"nr_hugepages", &p.total}, {"free_hugepages", &p.free}, {"resv_hugepages", &p.reserved}} {
		b, err := os.ReadFile(filepath.Join(dir, f.name))
		if err != nil {
			return hugePool{}
		}
		if *f.v, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err != nil {
			return hugePool{}
		}
	}
	p.ok = true
	return p
}

// hugeTLBShort is the error of a hugetlb map the kernel refused with
// ENOMEM: how many 2 MiB pages the guest's RAM needs (all ranges: any
// mapped already are released again), how many the pool has free, and
// the fix.
func hugeTLBShort(ranges []Range, p hugePool, err error) error {
	var need int64
	for _, r := range ranges {
		need += int64(r.Size / HugeTLBPageSize)
	}
	if !p.ok {
		return fmt.Errorf("memory: hugetlb: guest RAM needs %d free 2 MiB pages and the pool (%s) is unreadable: "+
			"reserve them with sysctl vm.nr_hugepages: %w", need, hugePoolDir, err)
	}
	// Reserved pages are counted free until they are touched, but they are
	// another mapping's.
	avail := max(p.free-p.reserved, 0)
	if avail >= need {
		return fmt.Errorf("memory: hugetlb: guest RAM needs %d 2 MiB pages and the pool has %d free "+
			"(%d free, %d reserved by other mappings), yet the kernel refused them: "+
			"a hugetlb cgroup limit (hugetlb.2MB.max) or a mapping limit may apply: %w",
			need, avail, p.free, p.reserved, err)
	}
	return fmt.Errorf("memory: hugetlb: guest RAM needs %d 2 MiB pages and the pool has %d free "+
		"(vm.nr_hugepages %d: %d free, %d reserved by other mappings): raise vm.nr_hugepages by at least %d "+
		"(sysctl -w vm.nr_hugepages=%d), or boot without hugetlb: %w",
		need, avail, p.total, p.free, p.reserved, need-avail, p.total+need-avail, err)
}
