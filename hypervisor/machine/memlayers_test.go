package machine

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// fileHoles lists the page-aligned holes of at least min bytes inside the
// range asked, a hole running to the end of the file included.
func TestFileHoles(t *testing.T) {
	const k = 1 << 10
	f, err := os.Create(filepath.Join(t.TempDir(), "mem"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(2048 * k); err != nil {
		t.Fatal(err)
	}
	page := []byte(strings.Repeat("x", 4*k))
	// Data at 0, 1024 KiB and 1096 KiB: holes of 1020, 68 and 948 KiB between.
	for _, off := range []int64{0, 1024 * k, 1096 * k} {
		if _, err := f.WriteAt(page, off); err != nil {
			t.Fatal(err)
		}
	}
	// Where holes are not reported (a file system without SEEK_HOLE
	// support reports the whole file as data), nothing is mapped anonymous.
	if h, _ := fileHoles(f, 0, 2048*k, 0); len(h) == 0 {
		t.Skipf("%s reports no holes", f.Name())
	}
	for _, c := range []struct {
		from, to, min int64
		want          [][2]int64
	}{
		{0, 2048 * k, 64 * k, [][2]int64{{4 * k, 1024 * k}, {1028 * k, 1096 * k}, {1100 * k, 2048 * k}}},
		{0, 2048 * k, 100 * k, [][2]int64{{4 * k, 1024 * k}, {1100 * k, 2048 * k}}},
		{8 * k, 1032 * k, 64 * k, [][2]int64{{8 * k, 1024 * k}}}, // clipped to the range
		{1024 * k, 1028 * k, 0, nil},                                   // all data
		{1500 * k, 1600 * k, 64 * k, [][2]int64{{1500 * k, 1600 * k}}}, // inside one hole
	} {
		got, err := fileHoles(f, c.from, c.to, c.min)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("fileHoles(%d KiB, %d KiB, min %d KiB) = %v, want %v", c.from/k, c.to/k, c.min/k, got, c.want)
		}
	}
}

// A restore maps the memory file's large holes as anonymous memory (no
// page cache page filled with zeros, then copied, per guest page touched
// there) and the guest runs on from the snapshot as before.
func TestRestoreMapsHolesAnonymous(t *testing.T) {
	dir := rngSnapshot(t)
	snap, err := snapshot.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Restore(snap, Config{}, attachRNG)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r := m.mem.Regions()[0]
	memFile := snap.Path(snap.Manifest.Memory[0].File)
	file, anon := mapsIn(t, uint64(r.HostAddr()), uint64(r.HostAddr())+r.Size, memFile)
	if file == 0 || anon == 0 {
		t.Fatalf("guest RAM at %#x+%#x: %d bytes mapped from %s, %d anonymous; want both", r.HostAddr(), r.Size, file, memFile, anon)
	}
	if file+anon != int64(r.Size) {
		t.Fatalf("guest RAM: %d file-backed + %d anonymous bytes, region is %d", file, anon, r.Size)
	}
	// The counter's page is data in the file: it reads back as snapshotted.
	at := counter(t, m)
	if at < 100 {
		t.Fatalf("restored counter %d, the snapshot was taken above 100", at)
	}
	if err := m.StartRestored(false); err != nil {
		t.Fatal(err)
	}
	waitCounter(t, m, at+50)
}

// mapsIn sums the bytes inside [lo, hi) of this process's mappings that
// map path, and of those that map no file (the kernel merges anonymous
// mappings with their neighbours, so each is clipped to the range).
func mapsIn(t *testing.T, lo, hi uint64, path string) (file, anon int64) {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		var s, e uint64
		if _, err := fmt.Sscanf(fields[0], "%x-%x", &s, &e); err != nil || e <= lo || s >= hi {
			continue
		}
		s, e = max(s, lo), min(e, hi)
		switch {
		case len(fields) >= 6 && fields[5] == path:
			file += int64(e - s)
		case len(fields) == 5:
			anon += int64(e - s)
		}
	}
	return file, anon
}
