package snapshotter

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cube-runtime/cube/snapshotter/imagefile"
	"github.com/cube-runtime/cube/snapshotter/internal/xfspool"
)

// TestReflinkChildSharesParent checks on an XFS pool that a child costs no
// data blocks: its image is all shared extents right after Prepare.
func TestReflinkChildSharesParent(t *testing.T) {
	ctx := testCtx()
	pool := xfspool.New(t, 1<<30)
	s := open(t, filepath.Join(pool, "root"), ReflinkRequired)
	if s.Mode() != imagefile.ModeReflink {
		t.Fatalf("mode %s on XFS reflink pool", s.Mode())
	}
	m, err := s.Prepare(ctx, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	putFile(t, m[0].Source, "data", strings.Repeat("r", 8<<20))
	if err := s.Commit(ctx, "base", "p"); err != nil {
		t.Fatal(err)
	}
	pu, err := s.Usage(ctx, "base")
	if err != nil || pu.Size < 8<<20 {
		t.Fatalf("base usage %+v %v", pu, err)
	}
	m, err = s.Prepare(ctx, "c", "base")
	if err != nil {
		t.Fatal(err)
	}
	cu, err := s.Usage(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	if cu.Size != 0 {
		t.Fatalf("fresh reflinked child owns %d bytes, want 0 (all extents shared)", cu.Size)
	}
	putFile(t, m[0].Source, "new", "written after clone\n")
	if cu, _ = s.Usage(ctx, "c"); cu.Size == 0 {
		t.Fatal("child usage stayed 0 after a write")
	}
	if got := catFile(t, s.imagePath("1"), "new"); got != "" {
		t.Fatal("write to reflinked child visible in parent")
	}
}

// TestDiskFull fills a small tmpfs (which cannot reflink, so children are
// copies) and checks that a Prepare that runs out of space fails cleanly:
// an error, no record, no file left behind.
func TestDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a size-limited tmpfs")
	}
	needTools(t)
	ctx := testCtx()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	s := open(t, dir, ReflinkAuto)
	m, err := s.Prepare(ctx, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	// 14 MiB of data: the base fits, a second copy cannot.
	putFile(t, m[0].Source, "blob", strings.Repeat("f", 14<<20))
	if err := s.Commit(ctx, "base", "p"); err != nil {
		t.Fatal(err)
	}
	before := listImages(t, s)
	if _, err := s.Prepare(ctx, "child", "base"); err == nil {
		t.Fatal("prepare on a full disk succeeded")
	} else {
		t.Logf("prepare on full disk: %v", err)
	}
	if _, err := s.Stat(ctx, "child"); err == nil {
		t.Fatal("failed prepare left a record")
	}
	if after := listImages(t, s); len(after) != len(before) {
		t.Fatalf("failed prepare left files: %v -> %v", before, after)
	}
	// mkfs on a full disk: fill what remains, then ask for a new first layer.
	filler := filepath.Join(dir, "filler")
	_ = exec.Command("dd", "if=/dev/zero", "of="+filler, "bs=1M").Run() // stops at ENOSPC
	if _, err := s.Prepare(ctx, "fresh", ""); err == nil {
		t.Fatal("mkfs on a full disk succeeded")
	}
	os.Remove(filler)
	if after := listImages(t, s); len(after) != len(before) {
		t.Fatalf("failed mkfs left files: %v -> %v", before, after)
	}
	// Space is back: the same Prepare now works.
	if _, err := s.Prepare(ctx, "fresh", ""); err != nil {
		t.Fatalf("prepare after freeing space: %v", err)
	}
}
