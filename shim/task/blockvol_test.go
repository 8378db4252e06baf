package task

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cube-runtime/cube/shim/config"
	"github.com/cube-runtime/cube/shim/sandbox"
)

// createWithDevice creates container id of pod1 whose spec has host block
// device 7:minor at /dev/xvda, as containerd's CRI writes a volumeDevice
// (linux.devices entry plus an allow rule with the CRI permissions).
func (h *harness) createWithDevice(id string, minor int64, access string, mounts ...specs.Mount) error {
	dir := filepath.Join(h.t.TempDir(), id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		h.t.Fatal(err)
	}
	maj, min := int64(7), minor
	mode := os.FileMode(0o660)
	spec := specs.Spec{Version: specs.Version, Process: &specs.Process{Args: []string{"sleep"}, Cwd: "/"},
		Root: &specs.Root{Path: "rootfs"}, Annotations: map[string]string{SandboxIDAnnotation: "pod1"}, Mounts: mounts,
		Linux: &specs.Linux{
			Devices: []specs.LinuxDevice{{Path: "/dev/xvda", Type: "b", Major: 7, Minor: minor, FileMode: &mode}},
			Resources: &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{
				{Allow: false, Access: "rwm"}, {Allow: true, Type: "b", Major: &maj, Minor: &min, Access: access},
			}},
		}}
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		h.t.Fatal(err)
	}
	_, err := h.svc.Create(h.ctx, &taskAPI.CreateTaskRequest{ID: id, Bundle: dir, Rootfs: rootfs("/images/" + id + ".ext4")})
	return errgrpc.ToNative(err)
}

// A pod member's block volume: its slot holds the host device, the guest
// spec names the guest's numbers (device and rule), the same device for
// another container is refused, a failed create gives it back, and Delete
// releases slot and claim.
func TestCreateBlockVolume(t *testing.T) {
	h := newHarness(t)
	h.hostBlock = func(major, minor uint32) (string, uint64, error) {
		return fmt.Sprintf("/dev/loop%d", minor), 1 << 20, nil
	}
	h.svc.o.LoadConfig = func(string) (config.Config, error) {
		c := config.Default()
		c.StateDir, c.DiskSlots = h.stateDir, 5
		return c, nil
	}
	h.create("pod1", []string{"sleep"}, nil, map[string]string{SandboxIDAnnotation: "pod1", ContainerTypeAnnotation: "sandbox"})
	claims := filepath.Join(h.stateDir, sandbox.BlockClaimDirName)
	held := func() []string {
		m, _ := filepath.Glob(filepath.Join(claims, "7_3.*.*"))
		return m
	}
	if err := h.createWithDevice("app", 3, "rwm"); err != nil {
		t.Fatal(err)
	}
	if h.vmm.Disks["cube-slot-2"] != "/dev/loop3" || h.vmm.ReadOnly["cube-slot-2"] {
		t.Fatalf("slots %v read-only %v: want /dev/loop3 read-write in cube-slot-2 (0: pause, 1: app's rootfs)", h.vmm.Disks, h.vmm.ReadOnly)
	}
	var got specs.Spec
	if err := json.Unmarshal(h.agent.Spec("app"), &got); err != nil {
		t.Fatal(err)
	}
	d := got.Linux.Devices[0]
	if d.Path != "/dev/xvda" || d.Major != 253 || d.Minor != 32 || d.FileMode == nil || *d.FileMode != 0o660 {
		t.Errorf("guest device %+v, want /dev/xvda 253:32 mode 0660", d)
	}
	r := got.Linux.Resources.Devices[1]
	if r.Major == nil || *r.Major != 253 || *r.Minor != 32 || r.Access != "rwm" {
		t.Errorf("guest device rule %+v, want 253:32 rwm", r)
	}
	if len(held()) != 1 {
		t.Errorf("claims %v, want one", held())
	}
	err := h.createWithDevice("app2", 3, "r")
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "/dev/loop3") {
		t.Fatalf("same device again: %v", err)
	}
	if h.vmm.Disks["cube-slot-1"] != "/images/app.ext4" {
		t.Errorf("refused create changed slot 1: %v", h.vmm.Disks)
	}
	h.kill("app", "", 9)
	h.wait("app", "")
	h.delete("app", "")
	if !strings.HasSuffix(h.vmm.Disks["cube-slot-2"], "slot-2.img") || len(held()) != 0 {
		t.Fatalf("after delete: slot 2 at %q, claims %v", h.vmm.Disks["cube-slot-2"], held())
	}
	// A create failing after the attach (a refused mount) gives it back.
	err = h.createWithDevice("app3", 3, "rwm", specs.Mount{Destination: "/x", Type: "bind", Source: "/dev/null", Options: []string{"rbind"}})
	if err == nil {
		t.Fatal("create with a device bind mount succeeded")
	}
	if !strings.HasSuffix(h.vmm.Disks["cube-slot-2"], "slot-2.img") || len(held()) != 0 {
		t.Fatalf("after a failed create: slots %v, claims %v", h.vmm.Disks, held())
	}
	if err := h.createWithDevice("app4", 3, "r"); err != nil {
		t.Fatalf("after release: %v", err)
	}
	if !h.vmm.ReadOnly["cube-slot-2"] {
		t.Errorf("access r: slot 2 not read-only: %v", h.vmm.ReadOnly)
	}
}

// A spec whose device has no linux.devices entry at the volume's path is
// refused; one without resources keeps none.
func TestWithGuestDevices(t *testing.T) {
	raw := []byte(`{"ociVersion":"1.2.0","x-unknown":1,"linux":{"devices":[{"path":"/dev/xvda","type":"b","major":7,"minor":3}]}}`)
	vols := []sandbox.BlockVolume{{Host: "/dev/loop3", Container: "/dev/xvda", HostMajor: 7, HostMinor: 3, GuestMajor: 253, GuestMinor: 16}}
	out, err := withGuestDevices(raw, vols)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `"major":253,"minor":16`) || !strings.Contains(string(out), `"x-unknown":1`) {
		t.Errorf("rewritten spec %s", out)
	}
	vols[0].Container = "/dev/xvdb"
	if _, err := withGuestDevices(raw, vols); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "/dev/xvdb") {
		t.Errorf("no entry: %v", err)
	}
}
