package volume

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/volume/volumetest"
)

func entries(t sandbox.Tree) map[string]string {
	out := map[string]string{}
	for _, e := range t.Entries {
		switch e.Kind {
		case sandbox.TreeDir:
			out[e.Path] = fmt.Sprintf("dir %o", e.Mode)
		case sandbox.TreeFile:
			out[e.Path] = fmt.Sprintf("%o %s", e.Mode, e.Data)
		case sandbox.TreeSymlink:
			out[e.Path] = "-> " + e.Target
		}
	}
	return out
}

func TestReadTreeKubeletLayout(t *testing.T) {
	dir := t.TempDir()
	if err := volumetest.WriteAtomic(dir, map[string]string{"game.properties": "lives=3", "ui": "color=red"}); err != nil {
		t.Fatal(err)
	}
	tr, err := ReadTree(dir, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	got := entries(tr)
	ts, _ := os.Readlink(filepath.Join(dir, "..data"))
	want := map[string]string{
		ts: "dir 755", ts + "/game.properties": "644 lives=3", ts + "/ui": "644 color=red",
		"..data": "-> " + ts, "game.properties": "-> ..data/game.properties", "ui": "-> ..data/ui",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("tree:\n got %v\nwant %v", got, want)
	}
	// Entries come parent before child (the agent accepts any order, but a
	// stable one keeps fingerprints stable).
	seen := map[string]bool{}
	for _, e := range tr.Entries {
		if d := filepath.Dir(e.Path); d != "." && !seen[d] {
			t.Fatalf("%s listed before its directory", e.Path)
		}
		seen[e.Path] = true
	}
}

func TestFingerprintSeesTheSwap(t *testing.T) {
	dir := t.TempDir()
	if err := volumetest.WriteAtomic(dir, map[string]string{"token": "a"}); err != nil {
		t.Fatal(err)
	}
	fp1, err := Fingerprint(dir, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if fp2, _ := Fingerprint(dir, DefaultLimits); fp2 != fp1 {
		t.Fatal("fingerprint of an unchanged tree changed")
	}
	if err := volumetest.WriteAtomic(dir, map[string]string{"token": "b"}); err != nil {
		t.Fatal(err)
	}
	if fp3, _ := Fingerprint(dir, DefaultLimits); fp3 == fp1 {
		t.Fatal("fingerprint did not change with the swap")
	}
}

// A hostile host tree: nothing outside it is read, and what cannot be
// copied is refused, saying what and why.
func TestReadTreeHostile(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "shadow")
	if err := os.WriteFile(secret, []byte("root:x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		make func(dir string) error
		lim  Limits
		want string
	}{
		"absolute link": {make: func(d string) error { return os.Symlink(secret, filepath.Join(d, "k")) }, want: "absolute target"},
		"climbing link": {make: func(d string) error {
			if err := os.Mkdir(filepath.Join(d, "sub"), 0o755); err != nil {
				return err
			}
			return os.Symlink("../../x", filepath.Join(d, "sub", "k"))
		}, want: "leaves the volume"},
		"fifo":         {make: func(d string) error { return syscall.Mkfifo(filepath.Join(d, "p"), 0o644) }, want: "FIFO"},
		"too many":     {make: func(d string) error { return writeN(d, 5, 1) }, lim: Limits{Entries: 4, Bytes: 100, Depth: 4}, want: "more than 4 entries"},
		"too big":      {make: func(d string) error { return writeN(d, 3, 40) }, lim: Limits{Entries: 10, Bytes: 100, Depth: 4}, want: "more than 100 bytes"},
		"too deep":     {make: func(d string) error { return os.MkdirAll(filepath.Join(d, "a/b/c/d/e"), 0o755) }, lim: Limits{Entries: 10, Bytes: 100, Depth: 4}, want: "deeper than 4"},
		"sparse giant": {make: func(d string) error { return os.Truncate(mustCreate(d, "big"), 1<<40) }, want: "bytes of files"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := tc.make(dir); err != nil {
				t.Fatal(err)
			}
			lim := tc.lim
			if lim == (Limits{}) {
				lim = DefaultLimits
			}
			_, err := ReadTree(dir, lim)
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ReadTree: %v, want InvalidArgument with %q", err, tc.want)
			}
		})
	}
}

// A link to a directory outside is copied as a link (and refused if it
// leaves the tree), never walked into; an inside link to a dir is kept as a
// link, its target read once as the directory it is.
func TestReadTreeDoesNotFollowLinks(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "real"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "real", "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real", filepath.Join(dir, "alias")); err != nil {
		t.Fatal(err)
	}
	tr, err := ReadTree(dir, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	got := entries(tr)
	if len(got) != 3 || got["alias"] != "-> real" || got["real/f"] != "644 x" {
		t.Fatalf("tree: %v", got)
	}
}

func writeN(dir string, n, size int) error {
	for i := range n {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprint("f", i)), make([]byte, size), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func mustCreate(dir, name string) string {
	p := filepath.Join(dir, name)
	f, err := os.Create(p)
	if err == nil {
		f.Close()
	}
	return p
}

// A tree the kubelet swaps during the read is read again; one that never
// holds still is an error.
func TestReadRetriesASwap(t *testing.T) {
	dir := t.TempDir()
	if err := volumetest.WriteAtomic(dir, map[string]string{"k": "1"}); err != nil {
		t.Fatal(err)
	}
	calls := 0
	err := retryChanged(dir, func() error {
		calls++
		if calls == 1 {
			return volumetest.WriteAtomic(dir, map[string]string{"k": "2"})
		}
		return nil
	})
	if err != nil || calls != 2 {
		t.Fatalf("retryChanged: %v after %d reads, want success after 2", err, calls)
	}
	calls = 0
	err = retryChanged(dir, func() error {
		calls++
		return volumetest.WriteAtomic(dir, map[string]string{"k": fmt.Sprint(calls)})
	})
	if !errors.Is(err, errChanged) || calls != readAttempts {
		t.Fatalf("retryChanged of a tree always changing: %v after %d reads", err, calls)
	}
}
