package vmm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/hypervisor/control"
	"github.com/cube-runtime/cube/integration/vmmrun"
)

// TestGuestVirtioFS boots with -fs tag=share0 on a host directory: the guest mounts it (mount -t virtiofs),
// reads a host file, writes, makes a directory, renames and removes, and everything shows on the host; the
// share's symlinks to a host file outside it ("../outside/secret" and its absolute path) do not reach that
// file, and neither does "..", in reading or in writing. Then, mounted and holding a file open, the VM is
// snapshotted and rolled back in place: the guest reads on through the file it held and sees what the host
// wrote in the share meanwhile (the share is not rolled back).
func TestGuestVirtioFS(t *testing.T) {
	dir := t.TempDir()
	share, outside := filepath.Join(dir, "share"), filepath.Join(dir, "outside")
	must(t, os.Mkdir(share, 0o755))
	must(t, os.Mkdir(outside, 0o755))
	secret := filepath.Join(outside, "secret")
	must(t, os.WriteFile(secret, []byte("HOST-SECRET"), 0o644))
	must(t, os.WriteFile(filepath.Join(share, "host.txt"), []byte("from-the-host"), 0o644))
	must(t, os.WriteFile(filepath.Join(share, "doomed"), nil, 0o644))
	must(t, os.Symlink("../outside/secret", filepath.Join(share, "esc-rel")))
	must(t, os.Symlink(secret, filepath.Join(share, "esc-abs")))

	sock := filepath.Join(dir, "ctl.sock")
	r := vmmrun.Start(t, cubeVMM, guestArgs("virtiofs", "-fs", "tag=share0,path="+share, "-control", sock)...)
	r.WaitLine(t, "MOUNTED_WAITING=1", 5*time.Minute)
	c, err := control.Dial(t.Context(), sock)
	must(t, err)
	defer c.Close()
	// Mounted, the guest holding a share file open: a snapshot carries its FUSE session; the host writes in
	// the share; an in-place rollback re-opens the session against the same directory (which it does not
	// roll back), and the guest goes on with its node ids and open file.
	snap := filepath.Join(dir, "snap-mounted")
	if _, err := c.Snapshot(t.Context(), snap, false); err != nil {
		t.Fatalf("snapshot while mounted: %v\nconsole:\n%s", err, r.ConsoleTail())
	}
	must(t, os.WriteFile(filepath.Join(share, "host-after.txt"), []byte("written-after-the-snapshot"), 0o644))
	if _, err := c.Rollback(t.Context(), snap); err != nil {
		t.Fatalf("rollback while mounted: %v\nconsole:\n%s", err, r.ConsoleTail())
	}
	must(t, os.WriteFile(filepath.Join(share, "go"), nil, 0o644))
	r.WaitLine(t, "UNMOUNTED_WAITING=1", 3*time.Minute)
	if _, err := c.Snapshot(t.Context(), filepath.Join(dir, "snap-unmounted"), false); err != nil {
		t.Errorf("snapshot after umount: %v", err)
	}
	must(t, c.Stop(t.Context()))
	if st := r.Wait(t, 2*time.Minute); st != 12 {
		t.Fatalf("cube-vmm exit %d, want 12 (stopped); stderr:\n%s\nconsole:\n%s", st, r.Stderr(), r.ConsoleTail())
	}
	want := map[string]string{
		"MOUNT": "ok", "HOST_FILE": "from-the-host", "GUEST_WRITE": "ok", "TREE": "ok",
		"ESC_REL": "refused", "ESC_ABS": "refused", "ESC_DOTDOT": "refused", "ESC_WRITE": "refused", "UMOUNT": "ok",
		"HELD_READ": "from-the-host", "HOST_AFTER": "written-after-the-snapshot", "REREAD": "from-the-host",
	}
	for k, v := range want {
		if got := r.Result(k); got != v {
			t.Errorf("guest %s = %q, want %q", k, got, v)
		}
	}
	if got := r.Result("LIST"); !strings.Contains(got, "host.txt") || !strings.Contains(got, "gdir") || strings.Contains(got, "doomed") {
		t.Errorf("guest ls = %q", got)
	}
	if b, err := os.ReadFile(filepath.Join(share, "guest.txt")); err != nil || string(b) != "guest-wrote-this\n" {
		t.Errorf("host sees guest.txt = %q, %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(share, "gdir", "g")); err != nil || string(b) != "tree\n" {
		t.Errorf("host sees gdir/g = %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(share, "doomed")); !os.IsNotExist(err) {
		t.Errorf("doomed still on the host: %v", err)
	}
	if b, _ := os.ReadFile(secret); string(b) != "HOST-SECRET" {
		t.Errorf("outside file changed: %q", b)
	}
	if strings.Contains(r.ConsoleTail(), "HOST-SECRET") {
		t.Errorf("the guest printed the outside file")
	}
	if t.Failed() {
		t.Logf("console:\n%s", r.ConsoleTail())
	}
}
