package snapshotter

import (
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/plugins/snapshots/overlay"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/snapshotter/internal/xfspool"
)

const benchBase = 1 << 30 // bytes of data in the base image

// fill mounts mounts at a temp dir and writes benchBase bytes of incompressible
// data into one file, then unmounts.
func fill(b *testing.B, mounts []mount.Mount) {
	b.Helper()
	dir := b.TempDir()
	if err := mount.All(mounts, dir); err != nil {
		b.Fatalf("mount base: %v", err)
	}
	defer func() {
		if err := mount.UnmountAll(dir, 0); err != nil {
			b.Errorf("unmount base: %v", err)
		}
	}()
	f, err := os.Create(filepath.Join(dir, "payload"))
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 4<<20)
	rand.Read(buf)
	for n := 0; n < benchBase; n += len(buf) {
		buf[0]++ // every chunk distinct
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
}

func freeBytes(b *testing.B, path string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		b.Fatal(err)
	}
	return int64(st.Bfree) * st.Bsize
}

// setupBase commits a base snapshot holding benchBase bytes of data.
func setupBase(b *testing.B, sn snapshots.Snapshotter, withData bool) {
	ctx := testCtx()
	m, err := sn.Prepare(ctx, "base-active", "")
	if err != nil {
		b.Fatal(err)
	}
	if withData {
		fill(b, m)
	}
	if err := sn.Commit(ctx, "base", "base-active"); err != nil {
		b.Fatal(err)
	}
	unix.Sync()
}

// benchPrepare times Prepare of a container snapshot on top of the 1 GiB base
// and reports the disk space each Prepare consumed (filesystem free-space
// delta after sync, so shared extents cost nothing).
func benchPrepare(b *testing.B, sn snapshots.Snapshotter, pool string) {
	ctx := testCtx()
	var used int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		before := freeBytes(b, pool)
		b.StartTimer()
		if _, err := sn.Prepare(ctx, "container", "base"); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		unix.Sync()
		used += before - freeBytes(b, pool)
		if err := sn.Remove(ctx, "container"); err != nil {
			b.Fatal(err)
		}
		if c, ok := sn.(snapshots.Cleaner); ok {
			c.Cleanup(ctx)
		}
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(used)/float64(b.N), "newdisk-B/op")
}

// BenchmarkPrepare compares Prepare on a 1 GiB base: cube in reflink mode,
// cube in copy mode, and containerd's overlayfs snapshotter, all on the same
// XFS pool. Run as root: go test -run XXX -bench BenchmarkPrepare ./snapshotter/
// The bases are built once here (sub-benchmark bodies run once per b.N round).
func BenchmarkPrepare(b *testing.B) {
	pool := xfspool.New(b, 8<<30)
	// An empty base shows whether reflink Prepare depends on the data size.
	empty := openBench(b, filepath.Join(pool, "empty"), ReflinkRequired)
	setupBase(b, empty, false)
	b.Run("cube-reflink-emptybase", func(b *testing.B) { benchPrepare(b, empty, pool) })
	reflink := openBench(b, filepath.Join(pool, "reflink"), ReflinkRequired)
	setupBase(b, reflink, true)
	b.Run("cube-reflink", func(b *testing.B) { benchPrepare(b, reflink, pool) })
	copyMode := openBench(b, filepath.Join(pool, "copy"), ReflinkNever)
	setupBase(b, copyMode, true)
	b.Run("cube-copy", func(b *testing.B) { benchPrepare(b, copyMode, pool) })
	ov, err := overlay.NewSnapshotter(filepath.Join(pool, "overlay"))
	if err != nil {
		b.Skipf("overlayfs snapshotter unavailable: %v", err)
	}
	b.Cleanup(func() { ov.Close() })
	setupBase(b, ov, true)
	b.Run("overlayfs", func(b *testing.B) { benchPrepare(b, ov, pool) })
}

func openBench(b *testing.B, root string, p ReflinkPolicy) *Snapshotter {
	l := logrus.New()
	l.SetLevel(logrus.WarnLevel)
	s, err := New(context.Background(), Options{Root: root, DefaultSize: 2 << 30, Reflink: p, Log: logrus.NewEntry(l)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close(); os.RemoveAll(root) })
	return s
}
