package vmm

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/hypervisor/control"
	"github.com/cube-runtime/cube/integration/vmmrun"
)

// genSample is one "GEN=n id ged urandom" line of the vmgenid guest.
type genSample struct {
	seq, ged    int
	id, urandom string
}

func parseGen(v string) (genSample, error) {
	f := strings.Fields(v)
	var s genSample
	if len(f) != 4 {
		return s, fmt.Errorf("GEN line %q: want 4 fields", v)
	}
	s.id, s.urandom = f[1], f[3]
	if _, err := fmt.Sscan(f[0], &s.seq); err != nil {
		return s, fmt.Errorf("GEN line %q: no sample number: %v", v, err)
	}
	if len(s.id) != 32 || s.id == strings.Repeat("0", 32) {
		return s, fmt.Errorf("GEN line %q: the guest reads no 16-byte generation id at VGEN.ADDR", v)
	}
	if _, err := fmt.Sscan(f[2], &s.ged); err != nil {
		return s, fmt.Errorf("GEN line %q: no ACPI:Ged line in /proc/interrupts: %v", v, err)
	}
	return s, nil
}

// waitGen polls the guest's latest GEN sample until ok accepts one (bounded).
func waitGen(t *testing.T, r *vmmrun.Process, what string, ok func(genSample) bool) genSample {
	t.Helper()
	return waitSample(t, r, "GEN", what, parseGen, ok)
}

// waitSample polls the guest's latest result line key, parsed by parse, until
// ok accepts one; a line that does not parse, a VMM that exits or 2 minutes
// without such a sample fail the test.
func waitSample[S any](t *testing.T, r *vmmrun.Process, key, what string, parse func(string) (S, error), ok func(S) bool) S {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if v := r.Result(key); v != "" {
			s, err := parse(v)
			if err != nil {
				t.Fatalf("%s: %v\nconsole:\n%s", what, err, r.ConsoleTail())
			}
			if ok(s) {
				return s
			}
		}
		if st, done := r.Exited(); done {
			t.Fatalf("%s: cube-vmm exited %d; stderr:\n%s\nconsole:\n%s", what, st, r.Stderr(), r.ConsoleTail())
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no such sample within 2 minutes; console:\n%s", what, r.ConsoleTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// settledGen waits for the sample after first, the first line printed after a restore or rollback. That first
// line may have been computed before the snapshot (the shell read the id, then the VM was frozen and the line
// printed only after the restore); the next one is wholly the restored guest's.
func settledGen(t *testing.T, r *vmmrun.Process, what string, first genSample) genSample {
	t.Helper()
	t.Logf("%s: first sample %d id %s GED interrupts %d urandom %s", what, first.seq, first.id, first.ged, first.urandom)
	return waitGen(t, r, what, func(g genSample) bool { return g.seq > first.seq })
}

func dialCtl(t *testing.T, sock string) *control.Client {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := control.Dial(context.Background(), sock)
		if err == nil {
			t.Cleanup(func() { c.Close() })
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("control socket %s: %v", sock, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stopVMM stops a cube-vmm through its control socket and waits for its exit (12: stopped).
func stopVMM(t *testing.T, r *vmmrun.Process, c *control.Client) {
	t.Helper()
	if err := c.Stop(context.Background()); err != nil && !strings.Contains(err.Error(), "EOF") {
		t.Fatalf("stop: %v", err)
	}
	if st := r.Wait(t, time.Minute); st != 12 {
		t.Fatalf("cube-vmm exit %d after stop, want 12; stderr:\n%s", st, r.Stderr())
	}
}

// TestGuestVMGenID boots the Debian kernel with -vmgenid and checks from inside the guest: the kernel found
// the ACPI generation id device (\_SB.VGEN, _HID VMGENCTR) and its Generic Event Device (bound to the
// built-in acpi-ged driver), and reads a non-zero 16-byte id at the address VGEN.ADDR names. Then a snapshot
// is restored twice into new cube-vmm processes and one of them rolled back in place: each time the guest
// reads an id it never had and the GED's interrupt count has grown (the notification Linux's vmgenid driver
// turns into a CRNG reseed was delivered). Without the device, without a new id or without the notification
// this fails.
//
// Debian's cloud kernel 6.1 is built without CONFIG_VMGENID (CONFIG_VIRT_DRIVERS is off), so no driver binds
// VGEN and its CRNG is not reseeded by the notification: the urandom samples are logged, not asserted.
func TestGuestVMGenID(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "boot.ctl")
	r := vmmrun.Start(t, cubeVMM, guestArgs("vmgenid", "-vmgenid", "-rng=false", "-control", sock)...)
	r.WaitLine(t, "GEN=2 ", 3*time.Minute)
	for k, v := range map[string]string{"VMGENID_HID": "VMGENCTR", "VMGENID_PATH": `\_SB_.VGEN`, "GED_HID": "ACPI0013", "GED_DRIVER": "acpi-ged"} {
		if got := r.Result(k); got != v {
			t.Errorf("guest %s = %q, want %q", k, got, v)
		}
	}
	t.Logf("driver bound to VGEN in this guest kernel: %q (none: built without CONFIG_VMGENID)", r.Result("VMGENID_DRIVER"))
	booted := waitGen(t, r, "boot", func(genSample) bool { return true })
	if booted.ged != 0 {
		t.Errorf("the GED interrupt fired %d times before any restore", booted.ged)
	}
	ctl := dialCtl(t, sock)
	snap := filepath.Join(dir, "snap")
	if _, err := ctl.Snapshot(context.Background(), snap, false); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	// The snapshot's own id: the running VM keeps it.
	saved := waitGen(t, r, "after the snapshot", func(genSample) bool { return true })
	if saved.id != booted.id {
		t.Errorf("the id changed from %s to %s in the VM that was snapshotted", booted.id, saved.id)
	}
	stopVMM(t, r, ctl)

	seen := map[string]string{booted.id: "boot"}
	fresh := func(what string, s genSample, gedBefore int) {
		t.Helper()
		if prev, ok := seen[s.id]; ok {
			t.Errorf("%s: the guest reads id %s, the one it had after %s", what, s.id, prev)
		}
		seen[s.id] = what
		if s.ged <= gedBefore {
			t.Errorf("%s: GED interrupt count %d, not above %d: the guest was not notified", what, s.ged, gedBefore)
		}
		t.Logf("%s: sample %d id %s GED interrupts %d urandom %s", what, s.seq, s.id, s.ged, s.urandom)
	}
	for i := 1; i <= 2; i++ {
		what := fmt.Sprintf("restore %d", i)
		rsock := filepath.Join(dir, fmt.Sprintf("restore%d.ctl", i))
		rr := vmmrun.Start(t, cubeVMM, "restore", "-control", rsock, snap)
		s := settledGen(t, rr, what, waitGen(t, rr, what, func(genSample) bool { return true }))
		fresh(what, s, booted.ged)
		rc := dialCtl(t, rsock)
		if i == 2 {
			if _, err := rc.Rollback(context.Background(), snap); err != nil {
				t.Fatalf("rollback: %v", err)
			}
			// Every line the VM printed before the rollback (after the first) has s's id: one without it is
			// the rolled-back guest's.
			what := "in-place rollback"
			rb := settledGen(t, rr, what, waitGen(t, rr, what, func(g genSample) bool { return g.id != s.id }))
			fresh(what, rb, booted.ged)
		}
		stopVMM(t, rr, rc)
	}
	if t.Failed() {
		t.Logf("console:\n%s", r.ConsoleTail())
	}
}
