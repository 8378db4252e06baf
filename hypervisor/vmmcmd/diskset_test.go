package vmmcmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// TestRestoreDiskUseAndSet: "cube-vmm restore -disk-use data=F -disk-set
// data=G" makes no working copy (the disk dir stays empty), starts the guest
// and leaves the disk on G, which a snapshot of the restored VM records with
// G's size; the same through a standby's restore op. Bad flags are refused
// before anything is made.
func TestRestoreDiskUseAndSet(t *testing.T) {
	needKVM(t)
	dir := t.TempDir()
	snap := tickerSnapshot(t, dir)
	size := int64(4 * 4096) // tickerSnapshot's disk
	use, set := filepath.Join(dir, "stub.img"), filepath.Join(dir, "rootfs.img")
	if err := os.WriteFile(use, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(set, make([]byte, 2*size), 0o600); err != nil {
		t.Fatal(err)
	}
	check := func(name string, v *vmm, disks string) {
		t.Helper()
		again := filepath.Join(dir, name+"-again")
		if err := v.ctl.Pause(t.Context()); err != nil {
			t.Fatalf("%s: pause: %v\n%s", name, err, v.stderr)
		}
		if _, err := v.ctl.Snapshot(t.Context(), again, false); err != nil {
			t.Fatalf("%s: snapshot: %v", name, err)
		}
		v.stop(t)
		s, err := snapshot.Open(again)
		if err != nil {
			t.Fatal(err)
		}
		if d := s.Manifest.Shape.Disks[0]; d.Source != set || d.Size != 2*size {
			t.Errorf("%s: the restored VM's disk is %s (%d bytes), want %s (%d)", name, d.Source, d.Size, set, 2*size)
		}
		if ents, _ := os.ReadDir(disks); len(ents) != 0 {
			t.Errorf("%s: working copies made: %v", name, ents)
		}
	}
	disks, sock, con := t.TempDir(), filepath.Join(dir, "ctl"), filepath.Join(dir, "console.log")
	v := startVMM(t, sock, "restore", "-console", con, "-control", sock, "-disk-dir", disks,
		"-disk-use", "data="+use, "-disk-set", "data="+set, snap)
	waitFile(t, con, "...")
	check("command line", v, disks)

	disks, sb, sbCon := t.TempDir(), filepath.Join(dir, "standby"), filepath.Join(dir, "standby-console.log")
	s := startVMM(t, sb, "restore", "-standby", "-control", sb, "-console", sbCon, "-disk-dir", disks,
		"-disk-use", "data="+use, "-disk-set", "data="+set)
	if _, err := s.ctl.Restore(t.Context(), snap, false); err != nil {
		t.Fatal(err)
	}
	waitFile(t, sbCon, "...")
	check("standby", s, disks)

	small := filepath.Join(dir, "small.img")
	if err := os.WriteFile(small, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
		rc   int
		want string
	}{
		{"-disk-use of another size", []string{"-disk-use", "data=" + small}, ExitFailure, "small.img has 4096 bytes, the snapshot's disk 16384"},
		{"-disk-use of a serial the snapshot lacks", []string{"-disk-use", "nosuch=" + use}, ExitUsage, `-disk-use: the snapshot has no disk with serial "nosuch"`},
		{"-disk-set of a serial the snapshot lacks", []string{"-disk-set", "nosuch=" + set}, ExitUsage, `-disk-set: the snapshot has no disk with serial "nosuch"`},
		{"-disk-use and -disk-path", []string{"-disk-use", "data=" + use, "-disk-path", "data=" + filepath.Join(dir, "copy.img")}, ExitUsage, "both a -disk-path"},
	} {
		disks := t.TempDir()
		rc, _, errOut := run(append(append([]string{"restore", "-console", "none", "-disk-dir", disks}, c.args...), snap)...)
		if rc != c.rc || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: exit %d, stderr %q; want %d and %q", c.name, rc, errOut, c.rc, c.want)
		}
		noneLeft(t, c.name, disks, filepath.Join(dir, "none.vsock"))
	}
	if b, err := os.ReadFile(use); err != nil || int64(len(b)) != size {
		t.Errorf("the -disk-use file after the refusals: %d bytes, %v", len(b), err)
	}
}
