package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// A host directory bound into the share is seen there (read-only when
// asked, on the host side too), and releasing the share unbinds it
// without touching the host directory's files.
func TestShareBindAndRelease(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to bind-mount (the root tier runs it)")
	}
	state, src := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(src, "f"), []byte("host"), 0o644)
	sd := filepath.Join(state, ShareDirName)
	if err := os.Mkdir(sd, 0o700); err != nil {
		t.Fatal(err)
	}
	rw, ro := filepath.Join(sd, "v1"), filepath.Join(sd, "v2")
	if err := bindHostDir(src, rw, false); err != nil {
		t.Fatal(err)
	}
	if err := bindHostDir(src, ro, true); err != nil {
		_ = ReleaseShareDir(state)
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(rw, "f")); err != nil || string(b) != "host" {
		t.Errorf("through the bind: %q %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(ro, "new"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write through the read-only bind: %v, want EROFS", err)
	}
	if err := os.WriteFile(filepath.Join(rw, "new"), []byte("g"), 0o644); err != nil {
		t.Errorf("write through the bind: %v", err)
	}
	if err := bindHostDir(filepath.Join(src, "f"), filepath.Join(sd, "v3"), false); err == nil {
		t.Error("a regular file was bound as a shared directory")
	}
	if err := ReleaseShareDir(state); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sd); !os.IsNotExist(err) {
		t.Errorf("share dir still there: %v", err)
	}
	for _, f := range []string{"f", "new"} {
		if _, err := os.Stat(filepath.Join(src, f)); err != nil {
			t.Errorf("host file after release: %v", err)
		}
	}
}

// A snapshot of a sandbox with host directories shared is refused naming
// them (the guest's FUSE session cannot be saved yet); without, it is not.
func TestSnapshotRefusedWhileShared(t *testing.T) {
	s := &Sandbox{o: Options{ID: "sb1"}}
	if err := s.refuseShared(); err != nil {
		t.Fatal(err)
	}
	s.shared = []SharedDir{{Guest: "/run/cube/shared/v1", Host: "/srv/data", Ref: "host directory /srv/data at /data"}}
	_, err := s.Snapshot(context.Background(), SnapshotOptions{Dir: "/tmp/x"})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "host directory /srv/data at /data") {
		t.Fatalf("snapshot while shared: %v, want FailedPrecondition naming the volume", err)
	}
	if err := s.UnshareHostDir("/etc/passwd"); err == nil {
		t.Error("unshare of a path outside the share accepted")
	}
}
