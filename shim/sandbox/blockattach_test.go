package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/sandbox/sandboxtest"
)

// fakeHostDevices resolves 7:N to /dev/loopN of 1 MiB; 7:99 is missing.
func fakeHostDevices(major, minor uint32) (string, uint64, error) {
	if major != 7 || minor == 99 {
		return "", 0, fmt.Errorf("host block device %d:%d is not in /sys/dev/block: %w", major, minor, errdefs.ErrNotFound)
	}
	return fmt.Sprintf("/dev/loop%d", minor), 1 << 20, nil
}

type blockSandbox struct {
	sb    *sandbox.Sandbox
	vmm   *sandboxtest.VMM
	agent *sandboxtest.Agent
}

// startBlockSandbox runs sandbox id (3 slots, slot 0 its first rootfs) whose
// block volume claims are in claims.
func startBlockSandbox(t *testing.T, id, claims string) blockSandbox {
	t.Helper()
	agent := sandboxtest.NewAgent()
	vmm := sandboxtest.NewVMM(agent)
	sb, err := sandbox.New(sandbox.Options{ID: id, Dir: filepath.Join(t.TempDir(), id), DiskSlots: 3,
		VMM: vmm, Dial: sandboxtest.Dialer(agent), BootTimeout: time.Second,
		BlockClaimDir: claims, HostBlockDevice: fakeHostDevices})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := sb.Start(ctx, "/img/pause.ext4", "pause"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Stop(ctx) })
	return blockSandbox{sb, vmm, agent}
}

// blockSpec is a container spec with block devices /dev/xvd<a+i> of host
// 7:minor, each allowed access (CRI's rules: deny all, then allow each).
func blockSpec(access string, minors ...int64) *specs.Spec {
	rules := []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}
	var devs []specs.LinuxDevice
	for i, m := range minors {
		maj, min := int64(7), m
		devs = append(devs, specs.LinuxDevice{Path: fmt.Sprintf("/dev/xvd%c", 'a'+i), Type: "b", Major: 7, Minor: m})
		rules = append(rules, specs.LinuxDeviceCgroup{Allow: true, Type: "b", Major: &maj, Minor: &min, Access: access})
	}
	return &specs.Spec{Linux: &specs.Linux{Devices: devs, Resources: &specs.LinuxResources{Devices: rules}}}
}

// A block volume goes into a free slot (read-write, as the rule allows),
// gets the guest's numbers, and is claimed host-wide: another sandbox is
// refused it, naming the device and the holder, until it is detached.
func TestAttachBlockVolumes(t *testing.T) {
	claims := t.TempDir()
	a, b := startBlockSandbox(t, "sb1", claims), startBlockSandbox(t, "sb2", claims)
	ctx := context.Background()
	vols, err := a.sb.AttachBlockVolumes(ctx, "c1", blockSpec("rwm", 3))
	if err != nil {
		t.Fatal(err)
	}
	if len(vols) != 1 || vols[0].Slot != "cube-slot-1" || vols[0].Host != "/dev/loop3" || vols[0].ReadOnly || vols[0].GuestMajor != 253 || vols[0].GuestMinor != 16 {
		t.Fatalf("attached %+v", vols)
	}
	if a.vmm.Disks["cube-slot-1"] != "/dev/loop3" || a.vmm.ReadOnly["cube-slot-1"] {
		t.Fatalf("slot 1: %q read-only %v, want /dev/loop3 read-write", a.vmm.Disks["cube-slot-1"], a.vmm.ReadOnly["cube-slot-1"])
	}
	_, err = b.sb.AttachBlockVolumes(ctx, "c2", blockSpec("rwm", 3))
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "/dev/loop3") || !strings.Contains(err.Error(), "sandbox sb1 (container c1") {
		t.Fatalf("second sandbox: %v, want FailedPrecondition naming the device and sb1", err)
	}
	if b.vmm.Disks["cube-slot-1"] != filepath.Join(b.sb.Dir(), "slot-1.img") {
		t.Errorf("refused attach left slot 1 of sb2 at %q", b.vmm.Disks["cube-slot-1"])
	}
	if _, err := a.sb.Snapshot(ctx, sandbox.SnapshotOptions{Dir: filepath.Join(t.TempDir(), "snap")}); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "/dev/loop3") {
		t.Errorf("snapshot with a block volume: %v", err)
	}
	if err := a.sb.DetachBlockVolumes(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	if a.vmm.Disks["cube-slot-1"] != filepath.Join(a.sb.Dir(), "slot-1.img") {
		t.Errorf("detached slot 1 at %q, want its stub", a.vmm.Disks["cube-slot-1"])
	}
	if _, err := b.sb.AttachBlockVolumes(ctx, "c2", blockSpec("rwm", 3)); err != nil {
		t.Fatalf("after detach: %v", err)
	}
	// The VM's end releases the claim too.
	if err := b.sb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := a.sb.AttachBlockVolumes(ctx, "c3", blockSpec("rwm", 3)); err != nil {
		t.Fatalf("after the holder's VM stopped: %v", err)
	}
}

// Without "w" in the rule the medium is read-only; read-only holders in two
// sandboxes share the device.
func TestAttachBlockVolumeReadOnly(t *testing.T) {
	claims := t.TempDir()
	a, b := startBlockSandbox(t, "sb1", claims), startBlockSandbox(t, "sb2", claims)
	ctx := context.Background()
	for _, s := range []blockSandbox{a, b} {
		vols, err := s.sb.AttachBlockVolumes(ctx, "c1", blockSpec("r", 5))
		if err != nil {
			t.Fatal(err)
		}
		if !vols[0].ReadOnly || !s.vmm.ReadOnly[vols[0].Slot] {
			t.Errorf("%s: %+v, vmm read-only %v; want read-only", s.sb.ID(), vols[0], s.vmm.ReadOnly)
		}
	}
}

// A failure at any step gives back what the attach took: slot stubs,
// claims; the errors name the device.
func TestAttachBlockVolumesUndo(t *testing.T) {
	claims := t.TempDir()
	a := startBlockSandbox(t, "sb1", claims)
	ctx := context.Background()
	stubs := func() {
		t.Helper()
		for i := 1; i < 3; i++ {
			serial := sandbox.SlotSerial(i)
			if got, want := a.vmm.Disks[serial], filepath.Join(a.sb.Dir(), fmt.Sprintf("slot-%d.img", i)); got != want {
				t.Errorf("%s at %q, want its stub", serial, got)
			}
		}
		if ents, _ := filepath.Glob(filepath.Join(claims, "7_*.*.*")); len(ents) != 0 {
			t.Errorf("claims left: %v", ents)
		}
	}
	// The guest lookup fails for the second of two devices.
	a.agent.BlockDeviceErr = errors.New("no disk")
	_, err := a.sb.AttachBlockVolumes(ctx, "c1", blockSpec("rwm", 3, 4))
	if err == nil || !strings.Contains(err.Error(), "/dev/loop3") || !strings.Contains(err.Error(), "guest lookup") {
		t.Fatalf("agent failure: %v", err)
	}
	stubs()
	a.agent.BlockDeviceErr = nil
	// The VMM refuses the device.
	a.vmm.SetDiskErr = func(serial, path string) error {
		if path == "/dev/loop4" {
			return errors.New("open /dev/loop4: permission denied")
		}
		return nil
	}
	_, err = a.sb.AttachBlockVolumes(ctx, "c1", blockSpec("rwm", 3, 4))
	if err == nil || !strings.Contains(err.Error(), "attach block device /dev/loop4 to drive slot cube-slot-2") {
		t.Fatalf("vmm failure: %v", err)
	}
	stubs()
	a.vmm.SetDiskErr = nil
	// Three devices, two free slots.
	_, err = a.sb.AttachBlockVolumes(ctx, "c1", blockSpec("rwm", 3, 4, 5))
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "/dev/loop5") || !strings.Contains(err.Error(), "disk_slots") {
		t.Fatalf("no free slot: %v, want ResourceExhausted naming the device and disk_slots", err)
	}
	stubs()
	// The host device is gone.
	_, err = a.sb.AttachBlockVolumes(ctx, "c1", blockSpec("rwm", 99))
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "/dev/xvda") {
		t.Fatalf("missing host device: %v, want NotFound naming the container path", err)
	}
	// The same device twice in one sandbox (two containers).
	if _, err := a.sb.AttachBlockVolumes(ctx, "c1", blockSpec("rwm", 3)); err != nil {
		t.Fatal(err)
	}
	_, err = a.sb.AttachBlockVolumes(ctx, "c2", blockSpec("r", 3))
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "container c1") {
		t.Fatalf("same device, second container: %v", err)
	}
	if err := a.sb.DetachBlockVolumes(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	stubs()
	// A rootfs slot is no block volume's: a detach leaves it alone.
	if a.vmm.Disks["cube-slot-0"] != "/img/pause.ext4" {
		t.Errorf("slot 0 at %q", a.vmm.Disks["cube-slot-0"])
	}
}

// HostBlockDevice finds a loop device by its numbers, with its size.
func TestHostBlockDevice(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a loop device")
	}
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Skip("needs losetup (util-linux)")
	}
	img := filepath.Join(t.TempDir(), "vol.img")
	if err := os.WriteFile(img, make([]byte, 3<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "-f", "--show", img).Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	got, size, err := sandbox.HostBlockDevice(unix.Major(st.Rdev), unix.Minor(st.Rdev))
	if err != nil || got != dev || size != 3<<20 {
		t.Errorf("HostBlockDevice = %s, %d, %v; want %s, %d", got, size, err, dev, 3<<20)
	}
	if _, _, err := sandbox.HostBlockDevice(7, 1<<19); !errdefs.IsNotFound(err) {
		t.Errorf("no such device: %v, want NotFound", err)
	}
}
