package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/shim/template"
)

// TestTemplates: ls shows a template's key, size and shape and a failed
// build's error; rm removes one, refuses while a build holds its lock, and
// fails on an unknown key.
func TestTemplates(t *testing.T) {
	dir := t.TempDir()
	files := filepath.Join(dir, "files")
	os.MkdirAll(files, 0o755)
	for _, n := range []string{"cube-vmm", "vmlinuz", "initrd.img"} {
		os.WriteFile(filepath.Join(files, n), []byte(n), 0o755)
	}
	shape := template.Shape{VMM: filepath.Join(files, "cube-vmm"), Kernel: filepath.Join(files, "vmlinuz"),
		Initrd: filepath.Join(files, "initrd.img"), MemoryMiB: 256, VCPUs: 2, DiskSlots: 8}
	root := filepath.Join(dir, "templates")
	c := &template.Cache{Root: root, Wait: time.Second, Build: func(_ context.Context, _ template.Shape, _, snap string) error {
		os.MkdirAll(snap, 0o700)
		return os.WriteFile(filepath.Join(snap, "memory"), make([]byte, 8192), 0o600)
	}}
	if _, err := c.Get(context.Background(), shape); err != nil {
		t.Fatal(err)
	}
	key, _, _ := c.Key(shape)
	os.WriteFile(filepath.Join(root, "0123456789abcdef.failed"), []byte("2026-12-05T19:00:00Z: boot the template VM: no agent\n"), 0o600)
	// A template of an earlier layout (its key computed without NICs): listed, not used, removable.
	old := filepath.Join(root, "00112233445566778899aabbccddeeff")
	os.MkdirAll(filepath.Join(old, "vm"), 0o700)
	os.WriteFile(filepath.Join(old, "template.json"), []byte(`{"key":"00112233445566778899aabbccddeeff","version":"cube-template-1","created":"2026-12-01T00:00:00Z","shape":{"MemoryMiB":256,"VCPUs":1,"DiskSlots":8}}`), 0o600)

	code, out, errOut := run(t, Env{}, "templates", "ls", "--dir", root)
	if code != ExitOK || errOut != "" || !strings.Contains(out, key) || !strings.Contains(out, "256 MiB, 2 vCPU, 8 slots, 0 NICs, kernel vmlinuz, initrd initrd.img (sha256:") ||
		!strings.Contains(out, "0123456789abcdef") || !strings.Contains(out, "build failed: 2026-12-05T19:00:00Z: boot the template VM: no agent") ||
		!strings.Contains(out, "layout cube-template-1, not used by this shim") {
		t.Fatalf("ls: exit %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := run(t, Env{}, "templates", "rm", "--dir", root, filepath.Base(old)); code != ExitOK {
		t.Fatalf("rm of an old-layout template: exit %d %s", code, errOut)
	}

	lock, err := os.OpenFile(filepath.Join(root, key+".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	unix.Flock(int(lock.Fd()), unix.LOCK_EX)
	if code, _, errOut := run(t, Env{}, "templates", "rm", "--dir", root, key); code != ExitFailure || !strings.Contains(errOut, "being built") {
		t.Fatalf("rm during a build: exit %d %s", code, errOut)
	}
	lock.Close()
	if code, out, errOut := run(t, Env{}, "templates", "rm", "--dir", root, key, "0123456789abcdef"); code != ExitOK || !strings.Contains(out, key) {
		t.Fatalf("rm: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, _ := run(t, Env{}, "templates", "ls", "--dir", root); code != ExitOK || strings.Contains(out, key) || strings.Contains(out, "0123") {
		t.Fatalf("ls after rm: %s", out)
	}
	if code, _, errOut := run(t, Env{}, "templates", "rm", "--dir", root, "ffff"); code != ExitFailure || !strings.Contains(errOut, "not found") {
		t.Fatalf("rm unknown: exit %d %s", code, errOut)
	}
	if code, _, _ := run(t, Env{}, "templates", "frob"); code != ExitUsage {
		t.Fatalf("unknown subcommand: exit %d", code)
	}
	if code, out, _ := run(t, Env{}, "help", "templates"); code != ExitOK || !strings.Contains(out, "Usage: cube templates") {
		t.Fatalf("help: %d %s", code, out)
	}
}
