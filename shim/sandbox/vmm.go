package sandbox

import (
	"context"
	"net"

	"github.com/cube-runtime/cube/hypervisor/control"
)

// Disk is one virtio-blk drive of the VM.
type Disk struct {
	// Serial is how the guest finds the drive (/sys/block/<dev>/serial);
	// virtio-blk serials hold at most 20 bytes.
	Serial string
	// Path is the backing file on the host.
	Path     string
	ReadOnly bool
}

// VMConfig is what a VM is started with.
type VMConfig struct {
	Kernel    string
	Initrd    string
	Cmdline   string
	MemoryMiB uint32
	VCPUs     uint32
	// HugeTLB: guest memory from the 2 MiB hugetlb pool (a boot's only).
	HugeTLB bool
	Disks   []Disk
	// VsockPath is the hybrid vsock Unix socket the VMM creates.
	VsockPath string
	// ControlPath is the VMM's control socket (pause, resume, stop, info, disk).
	ControlPath string
	// ConsolePath receives the guest's serial console output.
	ConsolePath string
	// GuestCID is the guest's vsock context id.
	GuestCID uint32
	// Template, when set, is a snapshot directory to restore instead of booting.
	Template string
	// DiskPaths, for a Template restore, put the working copy of the
	// writable disk with a serial at a path (cube-vmm restore -disk-path);
	// the other disks' copies go beside the sockets.
	DiskPaths map[string]string
	// DiskUses, for a Template restore, back the disk with a serial with a
	// file as it is, no working copy (cube-vmm restore -disk-use): a
	// template's empty drive slot gets the sandbox's own stub.
	DiskUses map[string]string
	// DiskSets, for a Template restore, re-point the disk with a serial at
	// a file before the guest runs (cube-vmm restore -disk-set): the first
	// container's rootfs, attached while the restored VM is still parked.
	DiskSets map[string]string
	// Nets are the VM's virtio-net devices, in order: the VMM inherits each
	// tap fd (cube-vmm -net fd=N,mac=M, N = 3 + index).
	Nets []NIC
	// ReplaceNets: Nets replace the Template snapshot's own devices, one for
	// one (a restore; their MACs stay the snapshot's). A template without
	// devices cannot gain any.
	ReplaceNets bool
	// Shares are virtio-fs shared directories (cube-vmm -fs); for a
	// Template restore, the snapshot's shares re-pointed by tag (-fs-path).
	Shares []Share
}

// Share is a virtio-fs shared directory.
type Share struct{ Tag, Path string }

// VMExit is how the VMM process ended.
type VMExit struct {
	// Status is the exit status as a shell reports it (128+signal when killed).
	Status int
	Err    error
}

// VMM runs one VM. Start is called once; Wait's channel is closed (after
// Exit is set) when the VMM is gone, whoever stopped it.
type VMM interface {
	Start(ctx context.Context, cfg VMConfig) error
	// Pid is the host pid of the VMM process (0 before Start).
	Pid() int
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	// SetDisk points the pre-created drive slot with this serial at a new
	// backing file or block device (the guest sees a media change);
	// readOnly opens it read-only and fails the guest's writes.
	SetDisk(ctx context.Context, serial, path string, readOnly bool) error
	// Snapshot writes a whole-VM snapshot (memory, vCPU and device state,
	// copies of the writable disks) into dir, which must be absolute and not
	// exist yet, and returns the VMM's figures. A paused VM stays paused.
	// Incremental writes only the memory pages dirtied since the VM's last
	// snapshot, which dir must be beside (the VMM refuses otherwise).
	Snapshot(ctx context.Context, dir string, incremental bool) (control.SnapshotResult, error)
	// Rollback rolls the running VM back in place to the snapshot in dir
	// (same process, same sockets). A rollback that fails leaves the VM as
	// it was (cube-vmm undoes its own failure); one that succeeds has reset
	// every vsock connection.
	Rollback(ctx context.Context, dir string) (control.RollbackResult, error)
	// Stop ends the VM: a graceful stop request, then SIGKILL after ctx ends.
	Stop(ctx context.Context) error
	Wait() <-chan struct{}
	Exit() VMExit
	// DialVsock connects to a guest vsock port.
	DialVsock(ctx context.Context, port uint32) (net.Conn, error)
}
