package vmmcmd

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/hypervisor/snapshot/snapshottest"
)

// TestDiskPath: -disk-path puts a writable disk's working copy at the path
// given for its serial (replacing a file there), and refuses a serial the
// snapshot has no writable disk with.
func TestDiskPath(t *testing.T) {
	golden := snapshottest.Golden(t, snapshot.Version)
	snap, err := snapshot.Open(filepath.Join(golden, snapshottest.Full))
	if err != nil {
		t.Fatal(err)
	}
	var bad diskPathFlags
	for _, v := range []string{"root", "=/x", "root=rel/x", "root=/a/../b"} {
		if err := bad.Set(v); err == nil {
			t.Errorf("-disk-path %q accepted", v)
		}
	}
	dst := filepath.Join(t.TempDir(), "rootfs.img")
	if err := os.WriteFile(dst, []byte("containerd's image, replaced"), 0o600); err != nil {
		t.Fatal(err)
	}
	var paths diskPathFlags
	if err := paths.Set("root=" + dst); err != nil {
		t.Fatal(err)
	}
	if err := paths.Set("root=/elsewhere"); err == nil {
		t.Error("a serial given twice is accepted")
	}
	cfg, err := restoreConfig(snap, restoreFlags{})
	if err != nil {
		t.Fatal(err)
	}
	r := &restored{}
	if err := r.copyDisks(snap, &cfg, t.TempDir(), paths, nil); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(snap.Path(snap.Manifest.Shape.Disks[0].File))
	got, _ := os.ReadFile(dst)
	if cfg.Disks[0].Path != dst || !bytes.Equal(got, want) || len(r.copies) != 1 || r.copies[0] != dst {
		t.Errorf("disk 0 at %s (copies %v), %d bytes equal to the snapshot's: %v", cfg.Disks[0].Path, r.copies, len(got), bytes.Equal(got, want))
	}

	cfg, _ = restoreConfig(snap, restoreFlags{})
	other := diskPathFlags{"nosuch": filepath.Join(t.TempDir(), "x.img")}
	err = (&restored{}).copyDisks(snap, &cfg, "", other, nil)
	if !errors.As(err, new(usageError)) {
		t.Errorf("-disk-path of a serial the snapshot lacks: %v, want a usage error", err)
	}
}

// TestFSPath: -fs-path re-points a snapshot's share by tag; a malformed
// value, a tag given twice or a tag the snapshot lacks are refused.
func TestFSPath(t *testing.T) {
	golden := snapshottest.Golden(t, snapshot.Version)
	snap, err := snapshot.Open(filepath.Join(golden, snapshottest.Full))
	if err != nil {
		t.Fatal(err)
	}
	var bad fsPathFlags
	for _, v := range []string{"tag", "=/x", "tag=rel", "tag=/a/../b"} {
		if err := bad.Set(v); err == nil {
			t.Errorf("-fs-path %q accepted", v)
		}
	}
	var f fsPathFlags
	if err := f.Set("cube-vol=/run/x/fs"); err != nil {
		t.Fatal(err)
	}
	if err := f.Set("cube-vol=/run/y/fs"); err == nil {
		t.Error("a tag given twice is accepted")
	}
	if _, err := restoreConfig(snap, restoreFlags{fsPaths: f}); !errors.As(err, new(usageError)) {
		t.Errorf("-fs-path of a tag the snapshot lacks: %v, want a usage error", err)
	}
}
