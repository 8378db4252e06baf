package snapshottest

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// The golden snapshots: testdata/vN of package snapshot holds what cube-vmm
// wrote for format version N, made once (go test ./hypervisor/vmmcmd -run
// TestGolden -update) from a synthetic guest with a disk, vsock and rng:
//
//	vN/full/  a full snapshot of the counting guest, paused
//	vN/diff/  an incremental snapshot over full, after the guest ran on
//
// Each is a snapshot directory as written, except that memory.bin, 64 MiB
// of mostly holes, is stored as its pages (memory.pages.gz, below); Golden
// puts it back.
// The tests that read them say what may and may not change.

// Golden snapshot names inside testdata/vN.
const (
	Full = "full"
	Diff = "diff"
)

const pagesName = "memory.pages.gz"

// TestdataDir is package snapshot's testdata directory in the source tree.
func TestdataDir() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		panic("snapshottest: no caller information")
	}
	return filepath.Join(filepath.Dir(file), "..", "testdata")
}

// VersionDir is the golden snapshots' directory for version v.
func VersionDir(v int) string { return filepath.Join(TestdataDir(), "v"+strconv.Itoa(v)) }

// Versions lists the versions testdata has golden snapshots of.
func Versions() ([]int, error) {
	entries, err := os.ReadDir(TestdataDir())
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range entries {
		if v, err := strconv.Atoi(e.Name()[1:]); err == nil && e.IsDir() && e.Name()[0] == 'v' {
			out = append(out, v)
		}
	}
	sort.Ints(out)
	return out, nil
}

// Golden copies version v's golden snapshots into a temporary directory,
// memory files restored (sparse), and returns it: DIR/full and DIR/diff are
// snapshot directories.
func Golden(t testing.TB, v int) string {
	t.Helper()
	src := VersionDir(v)
	if _, err := os.Stat(src); err != nil {
		t.Fatalf("no golden snapshot of format version %d (%v): make it with go test ./hypervisor/vmmcmd -run TestGolden -update", v, err)
	}
	dst := t.TempDir()
	for _, name := range []string{Full, Diff} {
		if err := copyDir(filepath.Join(dst, name), filepath.Join(src, name), expand); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// Update makes version v's golden snapshots from the snapshot directories
// full and diff (diff an incremental child of full, beside it). A golden is
// made once per version: Update refuses to replace one (a changed encoding
// needs a new version, not a new golden; to remake a golden deliberately,
// delete it first, in a commit of its own).
func Update(v int, full, diff string) error {
	dst := VersionDir(v)
	if _, err := os.Stat(dst); err == nil {
		return fmt.Errorf("%s exists: a golden is made once per format version (bump snapshot.Version for a new one)", dst)
	}
	for name, src := range map[string]string{Full: full, Diff: diff} {
		if err := copyDir(filepath.Join(dst, name), src, compress); err != nil {
			return err
		}
	}
	return nil
}

// copyDir copies the files of src into a new dst; conv handles the memory
// file (either name of it).
func copyDir(dst, src string, conv func(dst, src string) error) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		s, d := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		if e.Name() == snapshot.MemoryName || e.Name() == pagesName {
			err = conv(dst, s)
		} else {
			err = copyFile(d, s)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

func copyFile(dst, src string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}

// The memory file is stored as memory.pages.gz: gzip of its size (u64
// little-endian) and then, per page that is not all zero, its offset (u64)
// and its 4 KiB. gzip alone cannot shrink 64 MiB of holes below 64 KiB.

// compress writes the memory file src into dir as memory.pages.gz.
func compress(dir, src string) error {
	mem, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	out, err := os.Create(filepath.Join(dir, pagesName))
	if err != nil {
		return err
	}
	defer out.Close()
	z, err := gzip.NewWriterLevel(out, gzip.BestCompression)
	if err != nil {
		return err
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(mem)))
	zero := make([]byte, snapshot.PageSize)
	for off := 0; off < len(mem); off += snapshot.PageSize {
		page := mem[off:min(off+snapshot.PageSize, len(mem))]
		if !bytes.Equal(page, zero[:len(page)]) {
			b = binary.LittleEndian.AppendUint64(b, uint64(off))
			b = append(b, page...)
			b = append(b, zero[len(page):]...)
		}
	}
	if _, err := z.Write(b); err != nil {
		return err
	}
	if err := z.Close(); err != nil {
		return err
	}
	return out.Close()
}

// expand writes memory.pages.gz (src) into dir as memory.bin, sparse.
func expand(dir, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	z, err := gzip.NewReader(in)
	if err != nil {
		return err
	}
	b, err := io.ReadAll(io.LimitReader(z, 64<<20))
	if err != nil {
		return err
	}
	if len(b) < 8 {
		return fmt.Errorf("%s: %d bytes", src, len(b))
	}
	size := int64(binary.LittleEndian.Uint64(b))
	out, err := os.Create(filepath.Join(dir, snapshot.MemoryName))
	if err != nil {
		return err
	}
	defer out.Close()
	const rec = 8 + snapshot.PageSize
	for b = b[8:]; len(b) >= rec; b = b[rec:] {
		off := int64(binary.LittleEndian.Uint64(b))
		if off < 0 || off >= size {
			return fmt.Errorf("%s: page at %#x beyond %d bytes", src, off, size)
		}
		if _, err := out.WriteAt(b[8:8+min(snapshot.PageSize, size-off)], off); err != nil {
			return err
		}
	}
	if len(b) != 0 {
		return fmt.Errorf("%s: %d trailing bytes", src, len(b))
	}
	if err := out.Truncate(size); err != nil {
		return err
	}
	return out.Close()
}

// Shape lists the structure of a JSON document: one "path type" line per
// value, object keys by name, array elements collapsed into "[]" (so lists
// of another length, as another host's CPUID or MSR list is, have the same
// shape), sorted and without duplicates. Two encodings with the same shape
// have the same names, nesting and kinds of value.
func Shape(b []byte) ([]string, error) {
	var v any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	set := map[string]bool{}
	shape(v, "$", set)
	out := make([]string, 0, len(set))
	for s := range set {
		out = append(out, s)
	}
	sort.Strings(out)
	return out, nil
}

func shape(v any, path string, set map[string]bool) {
	switch x := v.(type) {
	case map[string]any:
		set[path+" object"] = true
		for k, e := range x {
			shape(e, path+"."+k, set)
		}
	case []any:
		set[path+" array"] = true
		for _, e := range x {
			shape(e, path+"[]", set)
		}
	case string:
		set[path+" string"] = true
	case json.Number:
		set[path+" number"] = true
	case bool:
		set[path+" bool"] = true
	case nil:
		set[path+" null"] = true
	}
}
