package initsys

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMoveTree(t *testing.T) {
	src := t.TempDir()
	dst := filepath.Join(src, "newroot")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "lib/modules"), 0o755))
	must(os.WriteFile(filepath.Join(src, "init"), []byte("agent"), 0o755))
	must(os.WriteFile(filepath.Join(src, "lib/modules/a.ko"), []byte("ko"), 0o644))
	must(os.Symlink("init", filepath.Join(src, "sbin-init")))
	must(os.Mkdir(dst, 0o755))

	must(moveTree(src, dst))

	if b, err := os.ReadFile(filepath.Join(dst, "init")); err != nil || string(b) != "agent" {
		t.Fatalf("init not moved: %q %v", b, err)
	}
	if st, err := os.Stat(filepath.Join(dst, "init")); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("init mode: %v %v", st, err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "sbin-init")); err != nil || l != "init" {
		t.Fatalf("symlink: %q %v", l, err)
	}
	if _, err := os.Stat(filepath.Join(dst, "lib/modules/a.ko")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(src, "init")); !os.IsNotExist(err) {
		t.Fatalf("source file not removed: %v", err)
	}
}

func TestIsDevNull(t *testing.T) {
	var st unix.Stat_t
	if err := unix.Stat("/dev/null", &st); err != nil {
		t.Skipf("no /dev/null here: %v", err)
	}
	if !isDevNull(&st) {
		t.Error("/dev/null not recognised")
	}
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		t.Fatal(err)
	}
	if isDevNull(&st) {
		t.Error("a regular file taken for /dev/null")
	}
}
