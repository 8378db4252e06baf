package imagefile

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func needE2fs(t *testing.T) {
	for _, tool := range []string{"mkfs.ext4", "debugfs", "e2fsck", "resize2fs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found: install e2fsprogs", tool)
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"16MiB": 16 << 20, "16M": 16 << 20, "16mb": 16 << 20, "1G": 1 << 30, "10GiB": 10 << 30,
		"1.5G": 3 << 29, " 2T ": 2 << 40, "16777216": 16 << 20, "20000000": 20000768, "65536K": 64 << 20,
	} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "G", "1K", "15M", "17T", "-1G", "1e9", "0x10G", "NaN", "Inf", "1GG", "one", "1_000M"} {
		if got, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want error", in, got)
		}
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"10GiB", "512M", "1.5G", "16777216", "", "1e3", "-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			return
		}
		if n < MinSize || n > MaxSize || n%4096 != 0 {
			t.Fatalf("ParseSize(%q) = %d: out of range or unaligned", s, n)
		}
	})
}

func TestCreateReadGrow(t *testing.T) {
	needE2fs(t)
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "a.img")
	if err := CreateExt4(ctx, p, 1, Ext4Options{}); err == nil {
		t.Fatal("tiny image accepted")
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatal("failed create left a file")
	}
	if err := CreateExt4(ctx, p, 32<<20, Ext4Options{Features: []string{"^has_journal"}}); err != nil {
		t.Fatal(err)
	}
	if err := CreateExt4(ctx, p, 32<<20, Ext4Options{}); err == nil {
		t.Fatal("create over an existing image succeeded")
	}
	if a, _ := Allocated(p); a >= 32<<20/2 {
		t.Fatalf("new image not sparse: %d bytes allocated", a)
	}
	sb, err := ReadSuperblock(p)
	if err != nil {
		t.Fatal(err)
	}
	if int64(sb.BlocksCount)*int64(sb.BlockSize) != 32<<20 || sb.UsedInodes() < 2 {
		t.Fatalf("superblock %+v", sb)
	}
	if err := CreateExt4(ctx, filepath.Join(t.TempDir(), "b.img"), 32<<20, Ext4Options{Features: []string{"no_such_feature"}}); err == nil {
		t.Fatal("bad mkfs feature accepted")
	}
	if err := Grow(ctx, p, 16<<20); err == nil {
		t.Fatal("shrink accepted")
	}
	if err := Grow(ctx, p, 64<<20); err != nil {
		t.Fatal(err)
	}
	sb, _ = ReadSuperblock(p)
	if int64(sb.BlocksCount)*int64(sb.BlockSize) != 64<<20 {
		t.Fatalf("grown superblock %+v", sb)
	}
}

func TestCopyKeepsDataAndHoles(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	// data, 8 MiB hole, data, trailing hole
	a := bytes.Repeat([]byte("a"), 1<<20)
	b := bytes.Repeat([]byte("b"), 4096)
	f.WriteAt(a, 0)
	f.WriteAt(b, 9<<20)
	f.Truncate(32 << 20)
	f.Close()
	dst := filepath.Join(dir, "dst")
	if err := Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	sb, _ := os.ReadFile(src)
	db, _ := os.ReadFile(dst)
	if !bytes.Equal(sb, db) {
		t.Fatal("copy differs from source")
	}
	if got, _ := Allocated(dst); got > 2<<20 {
		t.Fatalf("copy allocated %d bytes: holes filled", got)
	}
	if err := Copy(dst, src); err == nil {
		t.Fatal("copy over existing file succeeded")
	}
	if err := Copy(filepath.Join(dir, "x"), filepath.Join(dir, "missing")); err == nil {
		t.Fatal("copy of missing file succeeded")
	}
	if _, err := os.Stat(filepath.Join(dir, "x")); !os.IsNotExist(err) {
		t.Fatal("failed copy left a file")
	}
	if ex, err := Exclusive(dst); err != nil || ex <= 0 || ex > 2<<20 {
		t.Fatalf("Exclusive(copy) = %d, %v", ex, err)
	}
}

func TestProbeAndCloneWithoutReflink(t *testing.T) {
	dir := t.TempDir()
	ok, err := ProbeReflink(dir)
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		t.Skipf("%s supports reflink; this test covers filesystems that do not", dir)
	}
	src := filepath.Join(dir, "s")
	os.WriteFile(src, []byte("x"), 0o600)
	if err := Clone(filepath.Join(dir, "d"), src); err == nil {
		t.Fatal("clone succeeded where probe said no")
	}
	if _, err := os.Stat(filepath.Join(dir, "d")); !os.IsNotExist(err) {
		t.Fatal("failed clone left a file")
	}
	if es, _ := os.ReadDir(dir); len(es) != 1 {
		t.Fatalf("probe left files: %v", es)
	}
}

func sbBytes(inodes, free uint32, magic uint16, logBlock uint32) []byte {
	b := make([]byte, 1024)
	binary.LittleEndian.PutUint32(b[0:], inodes)
	binary.LittleEndian.PutUint32(b[4:], 1000)
	binary.LittleEndian.PutUint32(b[12:], 10)
	binary.LittleEndian.PutUint32(b[16:], free)
	binary.LittleEndian.PutUint32(b[24:], logBlock)
	binary.LittleEndian.PutUint16(b[56:], magic)
	return b
}

func TestParseSuperblock(t *testing.T) {
	s, err := ParseSuperblock(sbBytes(100, 40, ext4Magic, 2))
	if err != nil || s.UsedInodes() != 60 || s.BlockSize != 4096 {
		t.Fatalf("%+v %v", s, err)
	}
	for _, b := range [][]byte{nil, make([]byte, 100), sbBytes(1, 0, 0x1234, 2), sbBytes(1, 2, ext4Magic, 2), sbBytes(1, 0, ext4Magic, 40)} {
		if _, err := ParseSuperblock(b); err == nil {
			t.Errorf("bad superblock accepted")
		}
	}
}

func FuzzParseSuperblock(f *testing.F) {
	f.Add(sbBytes(100, 40, ext4Magic, 2))
	f.Add(sbBytes(0, 0, ext4Magic, 6))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseSuperblock(b)
		if err != nil {
			return
		}
		if s.UsedInodes() < 0 || s.BlockSize < 1024 || s.BlockSize > 65536 || s.FreeBlocksCount > s.BlocksCount {
			t.Fatalf("inconsistent superblock accepted: %+v", s)
		}
	})
}

func fiemapBuf(n int, mapped uint32) []byte {
	b := make([]byte, fiemapHeaderSize+n*fiemapExtentSize)
	binary.NativeEndian.PutUint32(b[20:], mapped)
	for i := 0; i < n; i++ {
		e := b[fiemapHeaderSize+i*fiemapExtentSize:]
		binary.NativeEndian.PutUint64(e[0:], uint64(i)<<20)
		binary.NativeEndian.PutUint64(e[16:], 4096)
		binary.NativeEndian.PutUint32(e[40:], fiemapExtentShare)
	}
	return b
}

func TestParseFiemap(t *testing.T) {
	ext, err := parseFiemap(fiemapBuf(3, 3))
	if err != nil || len(ext) != 3 || ext[2].logical != 2<<20 || ext[1].flags != fiemapExtentShare {
		t.Fatalf("%+v %v", ext, err)
	}
	if _, err := parseFiemap(fiemapBuf(2, 3)); err == nil {
		t.Fatal("overlong extent count accepted")
	}
	if _, err := parseFiemap(make([]byte, 8)); err == nil {
		t.Fatal("short buffer accepted")
	}
}

func FuzzParseFiemap(f *testing.F) {
	f.Add(fiemapBuf(2, 2))
	f.Add(fiemapBuf(1, 9))
	f.Fuzz(func(t *testing.T, b []byte) {
		ext, err := parseFiemap(b)
		if err == nil && fiemapHeaderSize+len(ext)*fiemapExtentSize > len(b) {
			t.Fatalf("%d extents from %d bytes", len(ext), len(b))
		}
	})
}
