package vmm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/hypervisor/vmmcmd"
	"github.com/cube-runtime/cube/integration/vmmrun"
)

// The test host's 2 MiB hugetlb pool. It is empty unless a test fills it (setHugePages); the test host
// keeps transparent huge pages off (stage2.sh), so without it every guest page is mapped at 4 KiB.
const (
	hugePoolDir   = "/sys/kernel/mm/hugepages/hugepages-2048kB"
	nrHugePages   = "/proc/sys/vm/nr_hugepages"
	hugePageBytes = 2 << 20
)

// hugePool is the pool's state: pages in it, free (reserved ones included), reserved by a mapping but not
// yet touched.
type hugePool struct{ total, free, reserved int64 }

// held is what mappings have of the pool: touched pages and reserved ones.
func (p hugePool) held() int64 { return p.total - p.free + p.reserved }

func readHugePool(tb testing.TB) hugePool {
	tb.Helper()
	p, err := hugePoolNow()
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

func hugePoolNow() (hugePool, error) {
	var p hugePool
	for name, v := range map[string]*int64{"nr_hugepages": &p.total, "free_hugepages": &p.free, "resv_hugepages": &p.reserved} {
		b, err := os.ReadFile(filepath.Join(hugePoolDir, name))
		if err != nil {
			return p, fmt.Errorf("hugetlb pool: %w", err)
		}
		if *v, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err != nil {
			return p, fmt.Errorf("hugetlb pool %s: %w", name, err)
		}
	}
	return p, nil
}

// setHugePages sets vm.nr_hugepages to n for the rest of the test (the old value comes back in Cleanup,
// which runs after the Cleanups of VMs started later, so no guest holds pages then). The kernel may give
// fewer pages than asked when memory is fragmented: then memory is compacted once and it is asked again,
// and a pool still short fails the test.
func setHugePages(tb testing.TB, n int64) {
	tb.Helper()
	b, err := os.ReadFile(nrHugePages)
	if err != nil {
		tb.Fatalf("vm.nr_hugepages: %v", err)
	}
	old := strings.TrimSpace(string(b))
	tb.Cleanup(func() {
		if err := os.WriteFile(nrHugePages, []byte(old), 0o644); err != nil {
			tb.Errorf("restore vm.nr_hugepages=%s: %v", old, err)
		}
	})
	for try := 0; ; try++ {
		if err := os.WriteFile(nrHugePages, []byte(strconv.FormatInt(n, 10)), 0o644); err != nil {
			tb.Fatalf("set vm.nr_hugepages=%d: %v", n, err)
		}
		got := readHugePool(tb).total
		if got == n {
			return
		}
		if try == 1 {
			tb.Fatalf("vm.nr_hugepages=%d gave %d pages (memory too fragmented)", n, got)
		}
		// Ordering: before any nested guest of this test runs (compaction moves pages under them).
		os.WriteFile("/proc/sys/vm/compact_memory", []byte("1"), 0o200)
	}
}

// guestHugePages is what a guest of memMiB needs from the pool.
func guestHugePages(memMiB int) int64 { return int64(memMiB) << 20 / hugePageBytes }

// fillSample is one "FILL=n sum" line of the memfill guest.
type fillSample struct {
	seq int
	sum string
}

// waitFill polls the memfill guest's latest FILL sample until ok accepts one (bounded).
func waitFill(t *testing.T, r *vmmrun.Process, what string, ok func(fillSample) bool) fillSample {
	t.Helper()
	return waitSample(t, r, "FILL", what, parseFill, ok)
}

func parseFill(v string) (fillSample, error) {
	var s fillSample
	if _, err := fmt.Sscan(v, &s.seq, &s.sum); err != nil || len(s.sum) != 32 {
		return s, fmt.Errorf("FILL line %q: want a number and an md5 sum (%v)", v, err)
	}
	return s, nil
}

// TestCubeVMMHugeTLB boots the Debian kernel with -hugetlb: first on a pool too small, which cube-vmm refuses
// naming the shortfall and the fix; then on a pool with room, where the VM holds exactly its RAM's 128 pages
// of it. The guest fills 24 MiB of its RAM with random bytes and prints their md5 every second. A snapshot
// of it is rolled back in place (rewritten through the hugetlb mapping), then restored into a new process,
// which maps the snapshot's file with small pages (it holds nothing of the pool): both guests go on with the
// checksum the booted one had. A VM that stops gives its pages back.
func TestCubeVMMHugeTLB(t *testing.T) {
	const memMiB = 256
	need := guestHugePages(memMiB)
	base := readHugePool(t).held()

	setHugePages(t, base+need/2)
	rc, _, errOut := runVMM(t, time.Minute, "-kernel", guestKernel, "-initrd", markerInitrd, "-cmdline", guestCmdline,
		"-memory", fmt.Sprint(memMiB), "-hugetlb")
	if rc != vmmcmd.ExitFailure || !strings.Contains(errOut, fmt.Sprintf("needs %d 2 MiB pages", need)) ||
		!strings.Contains(errOut, "raise vm.nr_hugepages") {
		t.Fatalf("-hugetlb on a pool of %d pages: exit %d, want %d naming %d pages and vm.nr_hugepages; stderr:\n%s",
			base+need/2, rc, vmmcmd.ExitFailure, need, errOut)
	}
	t.Logf("short pool: %s", strings.TrimSpace(errOut))
	if h := readHugePool(t).held(); h != base {
		t.Errorf("the refused VM left %d pages held (before: %d)", h, base)
	}

	setHugePages(t, base+need+16)
	dir := t.TempDir()
	sock := filepath.Join(dir, "boot.ctl")
	r := vmmrun.Start(t, cubeVMM, guestArgs("memfill", "-hugetlb", "-rng=false", "-control", sock, "-log-level", "debug")...)
	booted := waitFill(t, r, "boot", func(fillSample) bool { return true })
	if h := readHugePool(t).held(); h-base != need {
		t.Errorf("booted with -hugetlb: the VM holds %d pages of the pool, want %d", h-base, need)
	}
	if !strings.Contains(r.Stderr(), "ram=hugetlb-2M") {
		t.Errorf("cube-vmm's log does not say its RAM is hugetlb:\n%s", tail(r.Stderr(), 20))
	}
	ctl := dialCtl(t, sock)
	snap := filepath.Join(dir, "snap")
	if _, err := ctl.Snapshot(context.Background(), snap, false); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	saved := waitFill(t, r, "after the snapshot", func(s fillSample) bool { return s.seq > booted.seq })
	if saved.sum != booted.sum {
		t.Fatalf("the guest's checksum changed from %s to %s across the snapshot", booted.sum, saved.sum)
	}
	// The guest runs on past the snapshot; the rollback takes it back before saved.seq+3.
	ahead := waitFill(t, r, "before the rollback", func(s fillSample) bool { return s.seq >= saved.seq+3 })
	if _, err := ctl.Rollback(context.Background(), snap); err != nil {
		t.Fatalf("rollback: %v", err)
	}
	rolled := waitFill(t, r, "rollback", func(s fillSample) bool { return s.seq <= saved.seq+1 })
	if rolled.sum != booted.sum {
		t.Errorf("after the in-place rollback the checksum is %s, want %s", rolled.sum, booted.sum)
	}
	t.Logf("booted: sample %d sum %s; ahead %d; rolled back to %d", booted.seq, booted.sum, ahead.seq, rolled.seq)
	stopVMM(t, r, ctl)
	if h := readHugePool(t).held(); h != base {
		t.Errorf("after the hugetlb VM stopped %d pages are held, want %d", h, base)
	}

	rsock := filepath.Join(dir, "restore.ctl")
	rr := vmmrun.Start(t, cubeVMM, "restore", "-control", rsock, snap)
	restored := waitFill(t, rr, "restore", func(s fillSample) bool { return s.seq > saved.seq })
	if restored.sum != booted.sum {
		t.Errorf("restored guest's checksum %s, want %s", restored.sum, booted.sum)
	}
	if h := readHugePool(t).held(); h != base {
		t.Errorf("the restored VM holds %d pages of the pool, want none (it maps its snapshot with small pages)", h-base)
	}
	stopVMM(t, rr, dialCtl(t, rsock))
}
