package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// A device held read-write is refused to anyone else (naming the device
// and the holder); read-only holders share; a released or stale claim
// frees the device.
func TestBlockClaim(t *testing.T) {
	dir := t.TempDir()
	rw := claimHolder{Sandbox: "sb1", Container: "c1", Device: "/dev/loop3", Pid: 11}
	c1, err := claimBlockDevice(dir, 7, 3, rw)
	if err != nil {
		t.Fatal(err)
	}
	other := claimHolder{Sandbox: "sb2", Container: "c2", Device: "/dev/loop3", Pid: 12, ReadOnly: true}
	_, err = claimBlockDevice(dir, 7, 3, other)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "/dev/loop3 (7:3)") || !strings.Contains(err.Error(), "sandbox sb1 (container c1, shim pid 11, read-write)") {
		t.Fatalf("claim of a device held read-write: %v, want FailedPrecondition naming device and holder", err)
	}
	// Another device is independent.
	c4, err := claimBlockDevice(dir, 7, 4, other)
	if err != nil {
		t.Fatalf("another device: %v", err)
	}
	defer c4.release()
	if err := c1.release(); err != nil {
		t.Fatal(err)
	}
	if err := c1.release(); err != nil {
		t.Fatalf("second release: %v", err)
	}
	ro1, err := claimBlockDevice(dir, 7, 3, other)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	other.Sandbox = "sb3"
	ro2, err := claimBlockDevice(dir, 7, 3, other)
	if err != nil {
		t.Fatalf("second read-only holder: %v", err)
	}
	rw.Sandbox = "sb4"
	if _, err := claimBlockDevice(dir, 7, 3, rw); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("read-write claim while held read-only: %v", err)
	}
	ro1.release()
	ro2.release()
	if ents, _ := filepath.Glob(filepath.Join(dir, "7_3.*.*")); len(ents) != 0 {
		t.Errorf("holder files left after release: %v", ents)
	}
}

// A holder file nobody locks (its shim died) is stale: removed, not a conflict.
func TestBlockClaimStale(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "7_3.999999.sbdead")
	if err := os.WriteFile(stale, []byte(`{"sandbox":"sbdead","read_only":false}`), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := claimBlockDevice(dir, 7, 3, claimHolder{Sandbox: "sb1", Container: "c1", Device: "/dev/loop3", Pid: 1})
	if err != nil {
		t.Fatalf("claim over a stale holder: %v", err)
	}
	defer c.release()
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale holder file still there: %v", err)
	}
}

func TestDeviceAccess(t *testing.T) {
	i := func(n int64) *int64 { return &n }
	d := specs.LinuxDevice{Path: "/dev/xvda", Type: "b", Major: 7, Minor: 3}
	spec := func(rules ...specs.LinuxDeviceCgroup) *specs.Spec {
		return &specs.Spec{Linux: &specs.Linux{Resources: &specs.LinuxResources{Devices: rules}}}
	}
	denyAll := specs.LinuxDeviceCgroup{Allow: false, Access: "rwm"}
	for name, c := range map[string]struct {
		spec *specs.Spec
		want string
	}{
		"CRI rw":          {spec(denyAll, specs.LinuxDeviceCgroup{Allow: true, Type: "b", Major: i(7), Minor: i(3), Access: "rwm"}), "rwm"},
		"CRI r":           {spec(denyAll, specs.LinuxDeviceCgroup{Allow: true, Type: "b", Major: i(7), Minor: i(3), Access: "r"}), "r"},
		"other device":    {spec(denyAll, specs.LinuxDeviceCgroup{Allow: true, Type: "b", Major: i(7), Minor: i(4), Access: "rwm"}), ""},
		"char rule":       {spec(specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: i(7), Minor: i(3), Access: "rwm"}), ""},
		"all, later deny": {spec(specs.LinuxDeviceCgroup{Allow: true}, specs.LinuxDeviceCgroup{Allow: false, Type: "b", Major: i(7), Access: "w"}), "rm"},
		"no resources":    {&specs.Spec{Linux: &specs.Linux{}}, ""},
	} {
		if got := deviceAccess(c.spec, d); got != c.want {
			t.Errorf("%s: access %q, want %q", name, got, c.want)
		}
	}
}
