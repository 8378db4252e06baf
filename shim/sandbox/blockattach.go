package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Attaching raw block volumes (docs/shim.md, "Raw block volumes"): each
// block device of a container's spec becomes the medium of a free drive
// slot, claimed host-wide first, and the agent reports the slot's guest
// device numbers, which replace the host's in the container's spec.

// BlockClaimDirName is the directory of host-wide block volume claims in
// the shim config's state_dir (blockclaim.go).
const BlockClaimDirName = "block-claims"

// sysDevBlock is where the host's block devices are listed by number.
var sysDevBlock = "/sys/dev/block"

// HostBlockDevice finds the host's node and size of block device
// major:minor (the numbers containerd's CRI put in the spec): the kernel
// names it in /sys/dev/block, and /dev/<name> must be that device.
func HostBlockDevice(major, minor uint32) (string, uint64, error) {
	link, err := os.Readlink(filepath.Join(sysDevBlock, fmt.Sprintf("%d:%d", major, minor)))
	if err != nil {
		return "", 0, fmt.Errorf("host block device %d:%d is not in %s (detached since the container was made?): %w", major, minor, sysDevBlock, errdefs.ErrNotFound)
	}
	dev := filepath.Join("/dev", filepath.Base(link))
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK || unix.Major(st.Rdev) != major || unix.Minor(st.Rdev) != minor {
		return "", 0, fmt.Errorf("host block device %d:%d: %s is not that device (stat: %v): %w", major, minor, dev, err, errdefs.ErrNotFound)
	}
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", 0, fmt.Errorf("host block device %s: %w", dev, err)
	}
	defer unix.Close(fd)
	var size uint64
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size))); e != 0 {
		return "", 0, fmt.Errorf("size of host block device %s: %w", dev, e)
	}
	return dev, size, nil
}

// deviceAccess is the access ("rwm" subset) the spec's device cgroup rules
// give block device d, applied in order as the device controller does
// (an allow adds its letters, a deny removes them; empty access is "rwm").
func deviceAccess(spec *specs.Spec, d specs.LinuxDevice) string {
	if spec == nil || spec.Linux == nil || spec.Linux.Resources == nil {
		return ""
	}
	have := map[rune]bool{}
	for _, r := range spec.Linux.Resources.Devices {
		if r.Type != "" && r.Type != "a" && r.Type != d.Type ||
			r.Major != nil && *r.Major != d.Major || r.Minor != nil && *r.Minor != d.Minor {
			continue
		}
		acc := r.Access
		if acc == "" {
			acc = "rwm"
		}
		for _, c := range acc {
			have[c] = r.Allow
		}
	}
	var b strings.Builder
	for _, c := range "rwm" {
		if have[c] {
			b.WriteRune(c)
		}
	}
	return b.String()
}

// AttachBlockVolumes attaches the raw block volumes of containerID's spec
// (BlockDevices) and returns them with their guest device numbers; each is
// read-only when the spec's device rules do not allow "w". On error nothing
// of them stays attached or claimed.
func (s *Sandbox) AttachBlockVolumes(ctx context.Context, containerID string, spec *specs.Spec) (_ []BlockVolume, retErr error) {
	devs, err := BlockDevices(spec)
	if err != nil || len(devs) == 0 {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			if err := s.DetachBlockVolumes(context.WithoutCancel(ctx), containerID); err != nil {
				s.o.Log.WithError(err).WithField("container", containerID).Error("undo block volume attach")
			}
		}
	}()
	var out []BlockVolume
	for _, d := range devs {
		v, err := s.attachBlockVolume(ctx, containerID, d, DeviceReadOnly(deviceAccess(spec, d)))
		if err != nil {
			return nil, fmt.Errorf("container %s: %w", containerID, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// attachBlockVolume attaches one device; what it did is in s.blockVols for
// DetachBlockVolumes to undo.
func (s *Sandbox) attachBlockVolume(ctx context.Context, containerID string, d specs.LinuxDevice, ro bool) (BlockVolume, error) {
	agent := s.Agent()
	if agent == nil || s.State() != StateRunning {
		return BlockVolume{}, fmt.Errorf("sandbox %s is %s: %w", s.o.ID, s.State(), errdefs.ErrFailedPrecondition)
	}
	find := s.o.HostBlockDevice
	if find == nil {
		find = HostBlockDevice
	}
	host, size, err := find(uint32(d.Major), uint32(d.Minor))
	if err != nil {
		return BlockVolume{}, fmt.Errorf("block device at %s: %w", d.Path, err)
	}
	v := BlockVolume{Host: host, Container: d.Path, ReadOnly: ro, Owner: containerID, HostMajor: uint32(d.Major), HostMinor: uint32(d.Minor)}
	// Ordering: the sandbox's own check and slot first (nothing outside the
	// shim changes), then the host-wide claim, then the VMM opens the device,
	// then the guest looks at it.
	if err := s.reserveBlockVolume(&v); err != nil {
		return BlockVolume{}, err
	}
	if v.claim, err = claimBlockDevice(s.claimDir(), v.HostMajor, v.HostMinor, claimHolder{
		Sandbox: s.o.ID, Container: containerID, Device: host, ReadOnly: ro, Pid: os.Getpid(),
	}); err != nil {
		return BlockVolume{}, err
	}
	// Ordering: recorded as set before the call: a failed disk-set may
	// still have switched the medium, and detach puts the stub back.
	v.mediaSet = true
	s.updateBlockVolume(v)
	if err := s.o.VMM.SetDisk(ctx, v.Slot, host, ro); err != nil {
		return BlockVolume{}, fmt.Errorf("attach block device %s to drive slot %s: %w", host, v.Slot, err)
	}
	g, err := agent.BlockDevice(ctx, v.Slot, size)
	if err != nil {
		return BlockVolume{}, fmt.Errorf("block device %s in drive slot %s: guest lookup: %w", host, v.Slot, err)
	}
	v.GuestMajor, v.GuestMinor = g.Major, g.Minor
	s.updateBlockVolume(v)
	s.o.Log.WithField("container", containerID).WithField("device", host).WithField("slot", v.Slot).
		WithField("guest", g.Device).WithField("read_only", ro).Info("raw block volume attached")
	return v, nil
}

func (s *Sandbox) claimDir() string {
	if s.o.BlockClaimDir != "" {
		return s.o.BlockClaimDir
	}
	return filepath.Join(filepath.Dir(s.o.Dir), BlockClaimDirName)
}

// DetachBlockVolumes gives back containerID's raw block volumes: each slot
// points at its stub again, then its claim and the slot are released. A
// slot the VMM did not switch back keeps its claim (the VMM may still write
// the device) until the VM stops; the error names it.
func (s *Sandbox) DetachBlockVolumes(ctx context.Context, containerID string) error {
	s.mu.Lock()
	var vols []BlockVolume
	for _, v := range s.blockVols {
		if v.Owner == containerID {
			vols = append(vols, v)
		}
	}
	stopped := s.state == StateStopped
	s.mu.Unlock()
	var errs []error
	for _, v := range vols {
		// Ordering: the VMM lets go of the device before the claim goes, so
		// no other sandbox opens it while this guest can still write it.
		if v.mediaSet && !stopped {
			if err := s.o.VMM.SetDisk(ctx, v.Slot, v.stub, false); err != nil {
				errs = append(errs, fmt.Errorf("detach block device %s from drive slot %s (claim kept until the VM stops): %w", v.Host, v.Slot, err))
				continue
			}
		}
		if err := v.claim.release(); err != nil {
			s.o.Log.WithError(err).WithField("device", v.Host).Warn("release block volume claim")
		}
		s.releaseBlockVolume(v.Slot)
	}
	return errors.Join(errs...)
}

// releaseBlockVolumes drops every claim once the VMM is gone (teardown).
func (s *Sandbox) releaseBlockVolumes() {
	s.mu.Lock()
	vols := s.blockVols
	s.blockVols = nil
	s.mu.Unlock()
	for _, v := range vols {
		if err := v.claim.release(); err != nil {
			s.o.Log.WithError(err).WithField("device", v.Host).Warn("release block volume claim")
		}
	}
}
