package snapshot

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func testManifest() *Manifest {
	return &Manifest{
		Shape: Shape{VCPUs: 2, MemoryMiB: 1, Disks: []Disk{
			{Serial: "root", ReadOnly: true, Size: 4096, Source: "/img/root"},
			{Serial: "data", Size: 8192, File: "disk-1.img", Source: "/img/data"},
		}},
		Components: Components{KernelSHA256: "k", InitrdSHA256: "i", VMMVersion: "v1", AgentVersion: "a1"},
		Memory:     []MemoryLayer{{File: MemoryName, Size: 1 << 20}},
	}
}

// writeSnapshot makes a complete snapshot in dir/name and returns its path.
func writeSnapshot(t *testing.T, dir string) (string, []byte) {
	t.Helper()
	disk := filepath.Join(dir, "data.img")
	if err := os.WriteFile(disk, bytes.Repeat([]byte{7}, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(dir, "snap")
	w, err := Create(snap, 2<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	mem := make([]byte, 1<<20)
	copy(mem[5*PageSize:], "hello")
	mem[len(mem)-1] = 1
	f, err := w.CreateFile(MemoryName)
	if err != nil {
		t.Fatal(err)
	}
	n, err := WriteFull(f, [][]byte{mem[:512<<10], mem[512<<10:]})
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if n != 2*PageSize {
		t.Errorf("wrote %d bytes of memory, want 2 pages (the rest are zero holes)", n)
	}
	if _, _, err := w.CloneDisk(disk, "disk-1.img"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(snap); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("final directory visible before commit: %v", err)
	}
	if err := w.Commit(testManifest(), []byte("state payload")); err != nil {
		t.Fatal(err)
	}
	return snap, mem
}

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	snap, mem := writeSnapshot(t, dir)
	s, err := Open(snap)
	if err != nil {
		t.Fatal(err)
	}
	if string(s.State) != "state payload" {
		t.Errorf("state %q", s.State)
	}
	got, err := os.ReadFile(s.Path(MemoryName))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, mem) {
		t.Error("memory file differs from memory")
	}
	if err := s.Manifest.CheckShape(testManifest().Shape); err != nil {
		t.Errorf("check against the same shape: %v", err)
	}
	if err := s.Manifest.CheckComponents(testManifest().Components); err != nil {
		t.Errorf("check against the same components: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("temporary %s left behind", e.Name())
		}
	}
	if _, err := Create(snap, 0); err == nil {
		t.Error("Create over an existing snapshot succeeded")
	}
}

func TestAbortLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(filepath.Join(dir, "s"), 0)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := w.CreateFile(MemoryName)
	f.Write([]byte("partial"))
	f.Close()
	w.Abort()
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("abort left %v", entries)
	}
}

func TestNotEnoughSpace(t *testing.T) {
	_, err := Create(filepath.Join(t.TempDir(), "s"), 1<<62)
	if err == nil || !strings.Contains(err.Error(), "free") {
		t.Fatalf("want a free-space refusal, got %v", err)
	}
}

func TestRefusals(t *testing.T) {
	cases := []struct {
		name   string
		damage func(t *testing.T, snap string)
		want   error
	}{
		{"newer version", func(t *testing.T, snap string) {
			edit(t, filepath.Join(snap, ManifestName), `"format_version": 1`, `"format_version": 2`)
		}, ErrVersion},
		{"unknown state version", func(t *testing.T, snap string) {
			p := filepath.Join(snap, StateName)
			b, _ := os.ReadFile(p)
			b[8] = 9
			os.WriteFile(p, b, 0o600)
		}, ErrVersion},
		{"state checksum", func(t *testing.T, snap string) {
			p := filepath.Join(snap, StateName)
			b, _ := os.ReadFile(p)
			b[stateHeader] ^= 1
			os.WriteFile(p, b, 0o600)
		}, ErrChecksum},
		{"truncated state", func(t *testing.T, snap string) {
			p := filepath.Join(snap, StateName)
			b, _ := os.ReadFile(p)
			os.WriteFile(p, b[:len(b)-3], 0o600)
		}, ErrTruncated},
		{"truncated memory", func(t *testing.T, snap string) {
			os.Truncate(filepath.Join(snap, MemoryName), 4096)
		}, ErrTruncated},
		{"truncated disk copy", func(t *testing.T, snap string) {
			os.Truncate(filepath.Join(snap, "disk-1.img"), 100)
		}, ErrTruncated},
		{"escaping file name", func(t *testing.T, snap string) {
			edit(t, filepath.Join(snap, ManifestName), `"file": "disk-1.img"`, `"file": "../../etc/passwd"`)
		}, ErrCorrupt},
		{"no manifest", func(t *testing.T, snap string) {
			os.Remove(filepath.Join(snap, ManifestName))
		}, os.ErrNotExist},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			snap, _ := writeSnapshot(t, t.TempDir())
			c.damage(t, snap)
			_, err := Open(snap)
			if !errors.Is(err, c.want) {
				t.Fatalf("Open: %v, want %v", err, c.want)
			}
			t.Log(err)
		})
	}
}

func TestCheckMismatch(t *testing.T) {
	m := testManifest()
	for name, mod := range map[string]func(*Shape, *Components){
		"vcpus":     func(s *Shape, c *Components) { s.VCPUs = 1 },
		"memory":    func(s *Shape, c *Components) { s.MemoryMiB = 2 },
		"disks":     func(s *Shape, c *Components) { s.Disks = s.Disks[:1] },
		"disk size": func(s *Shape, c *Components) { s.Disks[1].Size = 1 },
		"kernel":    func(s *Shape, c *Components) { c.KernelSHA256 = "other" },
		"vmm":       func(s *Shape, c *Components) { c.VMMVersion = "v2" },
		"agent":     func(s *Shape, c *Components) { c.AgentVersion = "a2" },
	} {
		s, c := testManifest().Shape, testManifest().Components
		mod(&s, &c)
		err := m.CheckShape(s)
		if err == nil {
			err = m.CheckComponents(c)
		}
		if !errors.Is(err, ErrMismatch) {
			t.Errorf("%s: %v, want a mismatch", name, err)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

// CheckShape compares no disk paths; CheckComponents looks at no shape.
func TestCheckParts(t *testing.T) {
	m := testManifest()
	s := testManifest().Shape
	s.Disks[1].Source, s.Disks[1].File = "/elsewhere", "other.img"
	if err := m.CheckShape(s); err != nil {
		t.Errorf("CheckShape with other disk paths: %v", err)
	}
	other := testManifest()
	other.Shape.VCPUs++
	if err := other.CheckComponents(m.Components); err != nil {
		t.Errorf("CheckComponents of a manifest with another shape: %v", err)
	}
}

func TestDiffAndRuns(t *testing.T) {
	mem := make([]byte, 16*PageSize)
	for i := range mem {
		mem[i] = byte(i/PageSize + 1)
	}
	dirty := []uint64{1<<2 | 1<<3 | 1<<9}
	f, err := os.Create(filepath.Join(t.TempDir(), "diff"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := WriteDiff(f, [][]byte{mem[:8*PageSize], mem[8*PageSize:]}, dirty)
	if err != nil || n != 3*PageSize {
		t.Fatalf("WriteDiff: %d, %v", n, err)
	}
	got := make([]byte, len(mem))
	f.ReadAt(got, 0)
	for p := 0; p < 16; p++ {
		want := byte(0)
		if dirty[0]&(1<<p) != 0 {
			want = byte(p + 1)
		}
		if got[p*PageSize] != want {
			t.Errorf("page %d: %d, want %d", p, got[p*PageSize], want)
		}
	}
	runs := Runs(dirty, 16)
	if len(runs) != 2 || runs[0] != [2]int64{2, 4} || runs[1] != [2]int64{9, 10} {
		t.Errorf("runs %v", runs)
	}
	w, err := DecodeBitmap(EncodeBitmap(dirty))
	if err != nil || w[0] != dirty[0] {
		t.Errorf("bitmap round trip: %v %v", w, err)
	}
}

// TestRewritePages: a file written from memory that then changed is brought
// up to date by rewriting the dirty pages: changed pages get their new
// contents, pages that became zero read as zero (punched or written), pages
// not marked dirty are left alone, and the file keeps its size.
func TestRewritePages(t *testing.T) {
	const pages = 200 // crosses bitmap words and the region boundary
	mem := make([]byte, pages*PageSize)
	for p := range pages {
		if p%7 != 0 { // some pages stay zero from the start
			mem[p*PageSize] = byte(p + 1)
			mem[p*PageSize+PageSize-1] = 0xee
		}
	}
	regions := func() [][]byte { return [][]byte{mem[:96*PageSize], mem[96*PageSize:]} }
	f, err := os.Create(filepath.Join(t.TempDir(), "mem"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := WriteFull(f, regions()); err != nil {
		t.Fatal(err)
	}
	// The memory changes: some pages get new data, some become zero, some
	// zero pages get data; all of those are marked dirty. Page 150 changes
	// but is not marked: it must keep its old contents in the file.
	dirty := make([]uint64, (pages+63)/64)
	mark := func(p int) { dirty[p/64] |= 1 << (p % 64) }
	for _, p := range []int{1, 2, 3, 63, 64, 65, 95, 96, 97, 130, 199} {
		clear(mem[p*PageSize : (p+1)*PageSize])
		mark(p)
	}
	for _, p := range []int{0, 5, 7, 14, 100, 101, 102, 198} {
		for i := range PageSize {
			mem[p*PageSize+i] = byte(p ^ i)
		}
		mark(p)
	}
	for _, p := range []int{40, 41} { // dirty but unchanged
		mark(p)
	}
	stale := mem[150*PageSize]
	mem[150*PageSize] = 0x55
	n, err := RewritePages(f, regions(), dirty)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(10 * PageSize); n != want {
		t.Errorf("RewritePages wrote %d bytes, want %d (the non-zero dirty pages)", n, want)
	}
	got := make([]byte, len(mem))
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	mem[150*PageSize] = stale
	for p := range pages {
		if !bytes.Equal(got[p*PageSize:(p+1)*PageSize], mem[p*PageSize:(p+1)*PageSize]) {
			t.Errorf("page %d differs from memory", p)
		}
	}
	if fi, _ := f.Stat(); fi.Size() != int64(len(mem)) {
		t.Errorf("file is %d bytes, want %d", fi.Size(), len(mem))
	}
}

func edit(t *testing.T, p, from, to string) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(from)) {
		t.Fatalf("%s has no %q:\n%s", p, from, b)
	}
	os.WriteFile(p, bytes.Replace(b, []byte(from), []byte(to), 1), 0o600)
}

// TestCopyKeepsHoles: a disk copied without a reflink (copySparse, and
// CloneFile, which reflinks where it can) has the source's bytes and size,
// and its holes stay holes: a sparse 64 MiB file holding 16 KiB costs about
// that, not 64 MiB. The destination's old contents do not survive in a hole.
func TestCopyKeepsHoles(t *testing.T) {
	dir := t.TempDir()
	const size = 64 << 20
	src, err := os.Create(filepath.Join(dir, "src.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if err := src.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 1 << 20, 1<<20 + 4096, size - 4096} {
		if _, err := src.WriteAt(bytes.Repeat([]byte{byte(off>>12) | 1}, 4096), off); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(src.Name())
	if err != nil {
		t.Fatal(err)
	}
	allocated := func(path string) int64 {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			t.Fatal(err)
		}
		return st.Blocks * 512
	}
	check := func(name string) {
		t.Helper()
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: contents differ from the source (%d bytes, want %d)", name, len(got), len(want))
		}
		if a, s := allocated(filepath.Join(dir, name)), allocated(src.Name()); a > s+256<<10 {
			t.Fatalf("%s: %d bytes allocated for a source of %d: holes were filled", name, a, s)
		}
	}

	dst, err := os.Create(filepath.Join(dir, "dst.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if _, err := dst.Write(bytes.Repeat([]byte{0xee}, 3<<20)); err != nil { // old contents over a hole
		t.Fatal(err)
	}
	if err := copySparse(dst, src, size); err != nil {
		t.Fatal(err)
	}
	check("dst.img")

	if _, err := CloneFile(filepath.Join(dir, "clone.img"), src.Name()); err != nil {
		t.Fatal(err)
	}
	check("clone.img")
}

// TestCloneBlockDevice: a disk that is a host block device (a loop device
// here) is copied whole: its Stat size is 0, and it has no holes to keep.
// Needs root and losetup; skipped otherwise.
func TestCloneBlockDevice(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a loop device")
	}
	losetup, err := exec.LookPath("losetup")
	if err != nil {
		t.Skip("no losetup")
	}
	dir := t.TempDir()
	want := bytes.Repeat([]byte("blockdev"), 64<<10) // 512 KiB
	img := filepath.Join(dir, "loop.img")
	if err := os.WriteFile(img, want, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(losetup, "--read-only", "--find", "--show", img).Output()
	if err != nil {
		t.Skipf("losetup: %v", err)
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command(losetup, "-d", loop).Run() })
	copyPath := filepath.Join(dir, "copy.img")
	if _, err := CloneFile(copyPath, loop); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(copyPath); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("copy of %s: %d bytes (%v), want the device's %d", loop, len(got), err, len(want))
	}
}
