package sandbox

import (
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// BlockVolume is a raw block volume (Kubernetes volumeDevices, CRI
// devices) attached to the sandbox: a host block device given to the VM as
// the medium of a drive slot (disk-set, read-only when the CRI permissions
// lack "w"). Its contents are not part of a VM snapshot.
type BlockVolume struct {
	Host      string // host block device, e.g. /dev/loop3
	Container string // path of the node in the container, e.g. /dev/xvda
	ReadOnly  bool
	Slot      string // drive serial, e.g. cube-slot-3
	Owner     string // container id
	// HostMajor, HostMinor: the device's numbers on the host (the spec's);
	// GuestMajor, GuestMinor: the slot's in the guest (the agent's answer).
	HostMajor, HostMinor   uint32
	GuestMajor, GuestMinor uint32

	stub     string      // the slot's stub, its medium again at detach
	mediaSet bool        // the VMM may have the device open in the slot
	claim    *blockClaim // the host-wide claim (blockclaim.go)
}

// standardChar are the character devices a container spec may carry that
// the guest provides itself (runc's default set plus tun and fuse): they
// need nothing from the host.
var standardChar = map[string]bool{
	"/dev/null": true, "/dev/zero": true, "/dev/full": true, "/dev/random": true,
	"/dev/urandom": true, "/dev/tty": true, "/dev/console": true, "/dev/ptmx": true,
	"/dev/fuse": true, "/dev/net/tun": true,
}

// BlockDevices returns the spec's linux.devices entries that are raw block
// volumes (type "b"), to be attached through drive slots. A character
// device other than the standard ones is refused with InvalidArgument: a
// host character device cannot reach a VM. Two entries for one host device
// are refused with FailedPrecondition.
func BlockDevices(spec *specs.Spec) ([]specs.LinuxDevice, error) {
	if spec == nil || spec.Linux == nil {
		return nil, nil
	}
	var (
		out  []specs.LinuxDevice
		seen = map[string]bool{}
	)
	for _, d := range spec.Linux.Devices {
		switch d.Type {
		case "b":
			if seen[d.Path] {
				return nil, fmt.Errorf("block device %s is listed twice in the container spec; list each volumeDevice once: %w", d.Path, errdefs.ErrFailedPrecondition)
			}
			seen[d.Path] = true
			out = append(out, d)
		case "c", "u":
			if !standardChar[d.Path] {
				return nil, fmt.Errorf("character device %s (%d:%d) cannot be passed into a Cube VM (only raw block volumes and the standard devices /dev/null, zero, full, random, urandom, tty, console, ptmx, fuse, net/tun are); remove it from the container's devices or run the pod under runc (a privileged container lists every host device: under CRI set privileged_without_host_devices = true for the runtime, as contrib/containerd/cube-runtime.toml does): %w",
					d.Path, d.Major, d.Minor, errdefs.ErrInvalidArgument)
			}
		}
	}
	return out, nil
}

// DeviceReadOnly reports whether a device's cgroup access string (CRI
// permissions, as containerd puts them in linux.resources.devices: "rwm",
// "r", "rm") lacks write.
func DeviceReadOnly(access string) bool { return !strings.Contains(access, "w") }

// reserveBlockVolume records v as attached in a free drive slot, which it
// names in v.Slot. The same host device twice in one sandbox is refused
// with FailedPrecondition naming it and its holder (one medium in two
// drives would be written through two guest page caches); no free slot
// with ResourceExhausted naming the device and the disk_slots key.
func (s *Sandbox) reserveBlockVolume(v *BlockVolume) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.blockVols {
		if o.Host == v.Host {
			return fmt.Errorf("sandbox %s: block device %s is already attached (container %s, at %s, %s); a raw block volume can be used by one container of a sandbox at a time (ReadWriteMany sharing of a block device is not supported): %w",
				s.o.ID, v.Host, o.Owner, o.Container, o.Slot, errdefs.ErrFailedPrecondition)
		}
	}
	idx := slices.IndexFunc(s.slots, func(sl slot) bool { return sl.owner == "" })
	if idx < 0 {
		return fmt.Errorf("sandbox %s: no free drive slot for block device %s (at %s in container %s): all %d slots are in use by rootfs disks and block volumes; raise disk_slots in the shim config: %w",
			s.o.ID, v.Host, v.Container, v.Owner, len(s.slots), errdefs.ErrResourceExhausted)
	}
	s.slots[idx].owner, s.slots[idx].vol = v.Owner, v.Container
	v.Slot, v.stub = s.slots[idx].serial, s.slots[idx].stub
	s.blockVols = append(s.blockVols, *v)
	return nil
}

// updateBlockVolume stores v's progress (media set, claim, guest numbers).
func (s *Sandbox) updateBlockVolume(v BlockVolume) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.blockVols {
		if s.blockVols[i].Slot == v.Slot {
			s.blockVols[i] = v
		}
	}
}

// releaseBlockVolume forgets the volume attached in slot and frees the
// slot (after the slot went back to its stub).
func (s *Sandbox) releaseBlockVolume(slot string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.slots {
		if s.slots[i].serial == slot && s.slots[i].vol != "" {
			s.slots[i].owner, s.slots[i].vol = "", ""
		}
	}
	s.blockVols = slices.DeleteFunc(s.blockVols, func(o BlockVolume) bool { return o.Slot == slot })
}

// refuseBlockVolumes refuses a snapshot (and so rollback point, fork and
// template) while raw block volumes are attached: a host block device's
// contents are not part of a VM snapshot, so a restored guest would find
// the device changed under its page cache. Names the devices.
func (s *Sandbox) refuseBlockVolumes() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.blockVols) == 0 {
		return nil
	}
	names := make([]string, len(s.blockVols))
	for i, v := range s.blockVols {
		names[i] = fmt.Sprintf("block device %s at %s", v.Host, v.Container)
	}
	return fmt.Errorf("sandbox %s: %s attached as a raw block volume: a snapshot (or rollback point, fork, template) is refused because the device's contents are not part of a snapshot; delete the containers that use them first: %w",
		s.o.ID, strings.Join(names, ", "), errdefs.ErrFailedPrecondition)
}
