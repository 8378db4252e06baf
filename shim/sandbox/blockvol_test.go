package sandbox

import (
	"context"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func specWith(devs ...specs.LinuxDevice) *specs.Spec {
	return &specs.Spec{Linux: &specs.Linux{Devices: devs}}
}

// Block devices are picked out; the standard character devices pass.
func TestBlockDevices(t *testing.T) {
	got, err := BlockDevices(specWith(
		specs.LinuxDevice{Path: "/dev/null", Type: "c", Major: 1, Minor: 3},
		specs.LinuxDevice{Path: "/dev/net/tun", Type: "c", Major: 10, Minor: 200},
		specs.LinuxDevice{Path: "/dev/xvda", Type: "b", Major: 7, Minor: 3},
	))
	if err != nil || len(got) != 1 || got[0].Path != "/dev/xvda" {
		t.Fatalf("BlockDevices: %v, %v", got, err)
	}
	if got, err := BlockDevices(&specs.Spec{}); err != nil || got != nil {
		t.Errorf("no linux section: %v, %v", got, err)
	}
}

// A non-standard character device is refused with InvalidArgument naming it.
func TestBlockDevicesRefusesCharDevice(t *testing.T) {
	_, err := BlockDevices(specWith(specs.LinuxDevice{Path: "/dev/ttyUSB0", Type: "c", Major: 188, Minor: 0}))
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "/dev/ttyUSB0") {
		t.Fatalf("char device: %v, want InvalidArgument naming it", err)
	}
}

// The same block device twice in one spec is refused with FailedPrecondition.
func TestBlockDevicesRefusesDuplicate(t *testing.T) {
	d := specs.LinuxDevice{Path: "/dev/xvda", Type: "b", Major: 7, Minor: 3}
	_, err := BlockDevices(specWith(d, d))
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "/dev/xvda") {
		t.Fatalf("duplicate: %v, want FailedPrecondition naming it", err)
	}
}

func TestDeviceReadOnly(t *testing.T) {
	for access, want := range map[string]bool{"rwm": false, "rw": false, "r": true, "rm": true, "": true} {
		if got := DeviceReadOnly(access); got != want {
			t.Errorf("DeviceReadOnly(%q) = %v", access, got)
		}
	}
}

// The same host device attached twice in one sandbox is refused with
// FailedPrecondition naming it and its holder; after release it can be
// attached again. A full sandbox is refused with ResourceExhausted naming
// the device and the disk_slots key.
func TestReserveBlockVolumeRefusesSecondAttach(t *testing.T) {
	s := &Sandbox{o: Options{ID: "sb1"}, slots: []slot{{serial: "cube-slot-0", owner: "pause"}, {serial: "cube-slot-1"}, {serial: "cube-slot-2"}}}
	v := BlockVolume{Host: "/dev/loop3", Container: "/dev/xvda", Owner: "c1"}
	if err := s.reserveBlockVolume(&v); err != nil || v.Slot != "cube-slot-1" {
		t.Fatalf("reserve: slot %q, %v; want cube-slot-1", v.Slot, err)
	}
	w := BlockVolume{Host: "/dev/loop3", Container: "/dev/xvdb", Owner: "c2"}
	if err := s.reserveBlockVolume(&w); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "/dev/loop3") || !strings.Contains(err.Error(), "container c1") {
		t.Fatalf("second attach: %v, want FailedPrecondition naming the device and its holder", err)
	}
	x := BlockVolume{Host: "/dev/loop4", Container: "/dev/xvdc", Owner: "c2"}
	if err := s.reserveBlockVolume(&x); err != nil || x.Slot != "cube-slot-2" {
		t.Fatalf("reserve loop4: slot %q, %v", x.Slot, err)
	}
	y := BlockVolume{Host: "/dev/loop5", Container: "/dev/xvdd", Owner: "c3"}
	if err := s.reserveBlockVolume(&y); !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "/dev/loop5") || !strings.Contains(err.Error(), "disk_slots") {
		t.Fatalf("full sandbox: %v, want ResourceExhausted naming the device and disk_slots", err)
	}
	s.releaseBlockVolume("cube-slot-1")
	if s.slots[1].owner != "" || s.slots[0].owner != "pause" {
		t.Fatalf("release: slots %+v", s.slots)
	}
	if err := s.reserveBlockVolume(&w); err != nil || w.Slot != "cube-slot-1" {
		t.Fatalf("attach after release: slot %q, %v", w.Slot, err)
	}
}

// A snapshot while a block volume is attached is refused naming the device.
func TestSnapshotRefusedWithBlockVolume(t *testing.T) {
	s := &Sandbox{o: Options{ID: "sb1"}}
	if err := s.refuseBlockVolumes(); err != nil {
		t.Fatal(err)
	}
	s.blockVols = []BlockVolume{{Host: "/dev/loop3", Container: "/dev/xvda", Slot: "cube-slot-2"}}
	_, err := s.Snapshot(context.Background(), SnapshotOptions{Dir: "/tmp/x"})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "/dev/loop3") {
		t.Fatalf("snapshot with a block volume: %v, want FailedPrecondition naming the device", err)
	}
}

// A rollback while a block volume is attached is refused naming the device.
func TestRollbackRefusedWithBlockVolume(t *testing.T) {
	s := &Sandbox{o: Options{ID: "sb1"}}
	s.blockVols = []BlockVolume{{Host: "/dev/loop3", Container: "/dev/xvda", Slot: "cube-slot-2"}}
	_, err := s.Rollback(context.Background(), RollbackOptions{Dir: "/tmp/x"})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "/dev/loop3") {
		t.Fatalf("rollback with a block volume: %v, want FailedPrecondition naming the device", err)
	}
}
