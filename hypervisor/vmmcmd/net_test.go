package vmmcmd

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/hypervisor/virtio/net/taptest"
)

// TestNetFlagErrors: bad -net input exits 2 before any VM is made, with a
// message naming the field.
func TestNetFlagErrors(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage")
	os.WriteFile(garbage, []byte("not a kernel"), 0o644)
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	for _, c := range []struct{ net, msg string }{
		{"tap=t0,mac=52:54:00:12:34", "mac"},
		{"tap=t0,mac=52:54:00:12:34:zz", "mac"},
		{"tap=t0,mac=01:00:5e:00:00:01", "multicast"},
		{"tap=t0,mac=00:00:00:00:00:00", "all zero"},
		{"mac=52:54:00:12:34:56", "missing tap="},
		{"tap=t0,fd=5", "tap= and fd= both"},
		{"tap=t0,speed=10", `unknown key "speed"`},
		{"tap=t0,tap=t1", "tap given twice"},
		{"none,tap=t0", "none and tap= or fd= both"},
		{"fd=5,none", "none and tap= or fd= both"},
		{"none,none", "none given twice"},
		{"nothing", "not KEY=VALUE"},
		{"tap", "not KEY=VALUE"},
		{"fd=1", "fd"},
		{"fd=abc", "fd"},
		{"tap=a/b", "not an interface name"},
		{"tap=cube-nosuch0", `tap "cube-nosuch0": no such interface`},
		{"tap=lo", `tap "lo": not a tun/tap`},
		{"fd=" + strconv.Itoa(int(devnull.Fd())), "not an attached tap"},
	} {
		rc, _, errOut := run("-kernel", garbage, "-net", c.net)
		if rc != ExitUsage || !strings.Contains(errOut, c.msg) {
			t.Errorf("-net %s: exit %d stderr %q; want %d and %q", c.net, rc, errOut, ExitUsage, c.msg)
		}
	}
	// The config file: [[net]], unknown keys refused.
	cfgPath := filepath.Join(dir, "vm.toml")
	os.WriteFile(cfgPath, []byte("kernel = '/k'\n[[net]]\ntap = 'tap0'\nmac = '52:54:00:12:34:56'\n"), 0o644)
	cfg, err := parse([]string{"-config", cfgPath, "-net", "tap=tap1"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Net) != 2 || cfg.Net[0] != (Net{Tap: "tap0", MAC: "52:54:00:12:34:56"}) || cfg.Net[1].Tap != "tap1" {
		t.Errorf("nets %+v", cfg.Net)
	}
	os.WriteFile(cfgPath, []byte("kernel = '/k'\n[[net]]\ntapp = 'tap0'\n"), 0o644)
	if _, err := parse([]string{"-config", cfgPath}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "tapp") {
		t.Errorf("unknown [[net]] key: %v", err)
	}
	// A restore cannot change the MAC or keep a dead process's fd.
	nets := []Net{{Tap: "x", MAC: "52:54:00:12:34:56"}}
	if err := restoreNets(nets, []Net{{Tap: "y", MAC: "52:54:00:12:34:57"}}); err == nil || !strings.Contains(err.Error(), "mac") {
		t.Errorf("restore with another mac: %v", err)
	}
	if err := restoreNets([]Net{{FD: 7, MAC: "52:54:00:12:34:56"}}, nil); err == nil || !strings.Contains(err.Error(), "fd 7") {
		t.Errorf("restore of an fd device without -net: %v", err)
	}
	if err := restoreNets(nets, []Net{{Tap: "y"}, {Tap: "z"}}); err == nil || !strings.Contains(err.Error(), "2 times") {
		t.Errorf("restore with too many -net: %v", err)
	}
	// -net none parses, and a device without a backend restores as one, or
	// with the backend an override gives it (none cleared).
	if n, err := parseNet("none,mac=02:00:00:00:00:01"); err != nil || n != (Net{None: true, MAC: "02:00:00:00:00:01"}) {
		t.Errorf("-net none,mac=…: %+v %v", n, err)
	}
	none := []Net{{None: true, MAC: "52:54:00:12:34:56"}}
	if err := restoreNets(none, nil); err != nil || !none[0].None {
		t.Errorf("restore of a none device without -net: %+v %v", none, err)
	}
	if err := restoreNets(none, []Net{{FD: int(devnull.Fd())}}); err == nil || none[0].None {
		t.Errorf("restore of a none device onto a non-tap fd: %+v %v", none, err)
	}
	if b, _ := json.Marshal(Net{Tap: "t", MAC: "52:54:00:12:34:56"}); string(b) != `{"Tap":"t","MAC":"52:54:00:12:34:56"}` {
		t.Errorf("a tap device's recorded config changed: %s", b)
	}
}

// FuzzParseNet: any -net value either parses into a device that passes
// its own syntax check with exactly one backend, or is refused; never a
// panic.
func FuzzParseNet(f *testing.F) {
	for _, s := range []string{"tap=t0", "fd=3,mac=52:54:00:12:34:56", "none", "none,mac=02:00:00:00:00:01", "none,fd=4", "mac=", ",,", "none,none"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseNet(s)
		if err != nil {
			return
		}
		if err := n.checkSyntax(); err != nil {
			t.Fatalf("%q parsed to %+v, which its check refuses: %v", s, n, err)
		}
		backends := boolCount(n.None) + boolCount(n.Tap != "") + boolCount(n.FD != 0)
		if backends != 1 {
			t.Fatalf("%q parsed to %+v: %d backends", s, n, backends)
		}
	})
}

func boolCount(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestNetNoneSnapshotRestore is an automatic template's NIC at the VMM: a
// synthetic guest booted with -net none (no tap, no fd) records the device
// in its snapshot as none with its MAC; a restore without -net keeps it
// backend-less, and a restore with -net tap= gives it a real tap (the MAC
// stays the snapshot's) and runs.
func TestNetNoneSnapshotRestore(t *testing.T) {
	needKVM(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "ctl")
	const mac = "02:cb:00:00:00:01"
	v := startVMM(t, sock, "-kernel", kernel(t, counterCode), "-memory", "64", "-console", "none",
		"-control", sock, "-rng=false", "-net", "none,mac="+mac)
	time.Sleep(50 * time.Millisecond)
	if err := v.ctl.Pause(t.Context()); err != nil {
		t.Fatal(err)
	}
	s1 := filepath.Join(dir, "s1")
	if _, err := v.ctl.Snapshot(t.Context(), s1, false); err != nil {
		t.Fatal(err)
	}
	v.stop(t)
	cfg := snapConfig(t, s1)
	if len(cfg.Net) != 1 || cfg.Net[0] != (Net{None: true, MAC: mac}) {
		t.Fatalf("recorded nets %+v", cfg.Net)
	}
	r := startVMM(t, sock, "restore", "-paused", s1)
	if c := runUntilAdvanced(t, r.ctl, filepath.Join(dir, "s2"), snapCounter(t, s1)); c <= snapCounter(t, s1) {
		t.Fatalf("restored (none) counter did not advance: %d", c)
	}
	r.stop(t)

	taptest.Need(t)
	tap := taptest.Make(t, "cubev", 0)
	r = startVMM(t, sock, "restore", "-paused", "-net", "tap="+tap, s1)
	if c := runUntilAdvanced(t, r.ctl, filepath.Join(dir, "s3"), snapCounter(t, s1)); c <= snapCounter(t, s1) {
		t.Fatalf("restored (tap) counter did not advance: %d", c)
	}
	s4 := filepath.Join(dir, "s4")
	if _, err := r.ctl.Snapshot(t.Context(), s4, false); err != nil {
		t.Fatal(err)
	}
	r.stop(t)
	cfg = snapConfig(t, s4)
	if len(cfg.Net) != 1 || cfg.Net[0] != (Net{Tap: tap, MAC: mac}) {
		t.Errorf("nets after the restore onto a tap %+v", cfg.Net)
	}
}

// TestNetSnapshotRestore boots a synthetic guest with a virtio-net device
// on a real tap (the guest does not drive it): the snapshot records the
// device ("net" record, the configuration's tap and a generated MAC), a
// rollback keeps it, a new process restores onto the same tap, and a
// restore naming a missing tap or another MAC is refused.
func TestNetSnapshotRestore(t *testing.T) {
	needKVM(t)
	taptest.Need(t)
	tap := taptest.Make(t, "cubev", 0)
	dir := t.TempDir()
	sock := filepath.Join(dir, "ctl")
	v := startVMM(t, sock, "-kernel", kernel(t, counterCode), "-memory", "64", "-console", "none",
		"-control", sock, "-rng=false", "-net", "tap="+tap)
	time.Sleep(50 * time.Millisecond)
	if err := v.ctl.Pause(t.Context()); err != nil {
		t.Fatal(err)
	}
	s1 := filepath.Join(dir, "s1")
	if _, err := v.ctl.Snapshot(t.Context(), s1, false); err != nil {
		t.Fatal(err)
	}
	cfg := snapConfig(t, s1)
	if len(cfg.Net) != 1 || cfg.Net[0].Tap != tap || len(cfg.Net[0].MAC) != 17 {
		t.Fatalf("recorded nets %+v", cfg.Net)
	}
	st, err := os.ReadFile(filepath.Join(s1, snapshot.StateName))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(st, []byte(`{"Kind":"net"`)) || !bytes.Contains(st, []byte(cfg.Net[0].MAC)) {
		t.Error("state has no net record with the MAC")
	}
	if _, err := v.ctl.Rollback(t.Context(), s1); err != nil {
		t.Fatal(err)
	}
	v.stop(t)

	if rc, _, errOut := run("restore", "-net", "tap=cube-nosuch0", s1); rc != ExitUsage || !strings.Contains(errOut, "no such interface") {
		t.Errorf("restore onto a missing tap: exit %d %q", rc, errOut)
	}
	if rc, _, errOut := run("restore", "-net", "tap="+tap+",mac=52:54:00:00:00:01", s1); rc != ExitUsage || !strings.Contains(errOut, "mac") {
		t.Errorf("restore with another mac: exit %d %q", rc, errOut)
	}
	r := startVMM(t, sock, "restore", "-paused", s1)
	if c := runUntilAdvanced(t, r.ctl, filepath.Join(dir, "s2"), snapCounter(t, s1)); c <= snapCounter(t, s1) {
		t.Fatalf("restored counter did not advance: %d", c)
	}
	r.stop(t)
}
