package sandbox

import (
	"context"
	"net"
	"time"
)

// Guest vsock ports of the agent (guest-agent/protocol: AgentPort, StreamPort).
const (
	AgentPort  = 1024
	StreamPort = 1025
)

// Stream names one standard stream of a guest process.
type Stream string

const (
	Stdin  Stream = "stdin"
	Stdout Stream = "stdout"
	Stderr Stream = "stderr"
)

// StdioFlags says which streams a guest process gets; each one requested is
// attached with OpenStream before Start.
type StdioFlags struct{ Stdin, Stdout, Stderr bool }

// CreateContainerRequest mirrors cube.agent.v1.CreateContainerRequest.
type CreateContainerRequest struct {
	ContainerID string
	Spec        []byte // OCI runtime spec, JSON
	Rootfs      string // guest path of the mounted rootfs disk
	Stdio       StdioFlags
}

// ExecProcessRequest mirrors cube.agent.v1.ExecProcessRequest.
type ExecProcessRequest struct {
	ContainerID, ExecID string
	Process             []byte // OCI process, JSON
	Stdio               StdioFlags
}

// MountedDisk is what MountDisk answers: the guest mount point and what the
// mount took in the guest ("find=… settle=… mount=… readahead=…", ms; empty from an older
// agent), which the shim logs: the guest's own log lines cost a VM exit
// per byte of its serial console.
type MountedDisk struct {
	MountPoint string
	Timing     string
}

// CreatedContainer is what CreateContainer answers: the init's guest pid
// and what the create took in the guest ("cgroup=… prepare=… fork=… …",
// ms; empty from an older agent), for the shim's log.
type CreatedContainer struct {
	Pid    uint32
	Timing string
}

// MountDiskRequest mirrors cube.agent.v1.MountDiskRequest.
type MountDiskRequest struct {
	Serial, MountPoint, FSType string
	Options                    []string
	ReadOnly                   bool
}

// FreshenRequest is what Freshen sets: the guest's clock, host entropy
// (16..4096 bytes) for its RNG, and the disk to mount, if any.
type FreshenRequest struct {
	Time    time.Time
	Entropy []byte
	Mount   *MountDiskRequest
}

// GuestBlockDevice is a drive as the guest sees it.
type GuestBlockDevice struct {
	Device       string // e.g. /dev/vdc
	Major, Minor uint32
	Size         uint64
}

// ExitStatus is how a guest process ended: Status is the exit code, or
// 128+Signal when a signal killed it (as runc reports it).
type ExitStatus struct {
	Status   uint32
	Signal   uint32
	ExitedAt time.Time
}

// AgentClient is the part of the guest agent's ttrpc service (cube.agent.v1.Agent)
// and stream port the shim uses. agent_protocol.go adapts the generated
// client to it; tests use sandboxtest's fake.
type AgentClient interface {
	Health(ctx context.Context) error
	MountDisk(ctx context.Context, req MountDiskRequest) (MountedDisk, error)
	UnmountDisk(ctx context.Context, mountPoint string) error
	// BlockDevice finds the drive with serial (a raw block volume's slot),
	// waits until the guest sees size bytes (0: no wait) and returns its
	// guest device numbers. An agent older than the call answers
	// FailedPrecondition.
	BlockDevice(ctx context.Context, serial string, size uint64) (GuestBlockDevice, error)
	CreateContainer(ctx context.Context, req CreateContainerRequest) (CreatedContainer, error)
	// PrepareSpare parks a container helper with containerd's default
	// namespaces in the guest for the next create (a template is
	// snapshotted with one); it returns what making it took. An agent
	// older than the call answers FailedPrecondition.
	PrepareSpare(ctx context.Context) (timing string, err error)
	ExecProcess(ctx context.Context, req ExecProcessRequest) (pid uint32, err error)
	// Start lets a created process run; timing is what that took in the
	// guest ("exec=…", ms), empty from an agent that does not say.
	Start(ctx context.Context, containerID, execID string) (pid uint32, timing string, err error)
	Signal(ctx context.Context, containerID, execID string, signal uint32, all bool) error
	// Wait blocks until the process exited.
	Wait(ctx context.Context, containerID, execID string) (ExitStatus, error)
	CloseStdin(ctx context.Context, containerID, execID string) error
	ResizePty(ctx context.Context, containerID, execID string, width, height uint32) error
	ListPids(ctx context.Context, containerID string) ([]uint32, error)
	// Delete releases an exited process (execID set) or the container.
	Delete(ctx context.Context, containerID, execID string, force bool) (ExitStatus, error)
	SyncFilesystems(ctx context.Context) error
	// FreezeFilesystems syncs and freezes (FIFREEZE) every disk the agent
	// mounted: their images are then clean on disk, journal included.
	FreezeFilesystems(ctx context.Context) error
	// ThawFilesystems thaws what FreezeFilesystems froze (nothing frozen: no-op).
	ThawFilesystems(ctx context.Context) error
	// Freshen is a restored guest's first call: SetTime, ReseedRandom and,
	// with req.Mount, MountDisk in one round trip (the mount's answer, or a
	// zero MountedDisk). An agent without the call answers an error wrapping
	// errdefs.ErrNotImplemented: make the three calls instead.
	Freshen(ctx context.Context, req FreshenRequest) (MountedDisk, error)
	// SetTime steps the guest's CLOCK_REALTIME (stale after a restore).
	SetTime(ctx context.Context, t time.Time) error
	// ReseedRandom mixes host entropy (16..4096 bytes) into the guest pool and
	// forces a CRNG reseed, so VMs restored from one template differ.
	ReseedRandom(ctx context.Context, entropy []byte) error
	PowerOff(ctx context.Context) error
	// ConfigureNetwork has the agent configure the guest's interfaces (found
	// by MAC) and resolv.conf; idempotent.
	ConfigureNetwork(ctx context.Context, c NetworkConfig) error
	// WriteFile writes data as the guest file path (absolute, in the guest's
	// own root), creating parent directories; mode 0 means 0644.
	WriteFile(ctx context.Context, path string, data []byte, mode uint32) error
	// ReadFile reads up to max bytes of the guest file path (in the guest's
	// own root).
	ReadFile(ctx context.Context, path string, max int) ([]byte, error)
	// SyncTree makes the guest directory dir hold exactly t, swapping it
	// the way the kubelet does (agent.proto: SyncTree).
	SyncTree(ctx context.Context, dir string, t Tree) (TreeResult, error)
	// PrepareVolume makes a guest directory (or tmpfs) for a volume that
	// lives in the guest; idempotent.
	PrepareVolume(ctx context.Context, req VolumeRequest) error
	// OpenStream attaches one stdio stream of a created process. For stdin
	// the host's half-close (CloseWrite) is EOF; output streams end at EOF.
	OpenStream(ctx context.Context, containerID, execID string, s Stream) (net.Conn, error)
	// DialStream connects to the agent's stream port without attaching a
	// stream yet, so the connection can be made while the process is
	// being created; AttachStream then attaches one on it (the agent waits
	// 10 s for that). Together they are OpenStream.
	DialStream(ctx context.Context) (net.Conn, error)
	AttachStream(ctx context.Context, conn net.Conn, containerID, execID string, s Stream) (net.Conn, error)
	// ReattachStream connects one stdio stream of a process again after a
	// rollback or restore reset every vsock connection: the new connection
	// replaces the dead one (output the process wrote meanwhile is held by
	// the agent and delivered on it; stdin stays open).
	ReattachStream(ctx context.Context, containerID, execID string, s Stream) (net.Conn, error)
	// ListProcesses lists every process the agent holds (until Delete).
	ListProcesses(ctx context.Context) ([]GuestProcess, error)
	// RenameContainer gives a guest container (its init and execs) a new id:
	// a VM restored from a checkpoint under another containerd id.
	RenameContainer(ctx context.Context, containerID, newID string) error
	Close() error
}

// GuestProcess is one process as the guest agent holds it.
type GuestProcess struct {
	ContainerID, ExecID string // ExecID "" for the container's init
	Pid                 uint32
	// Status: "created", "running" or "stopped".
	Status   string
	Exit     ExitStatus // when stopped
	Stdio    StdioFlags // the streams it was created with
	Terminal bool
	// Known is the task service's, not the agent's: containerd knows the
	// process (its task or exec exists in the shim).
	Known bool
}

// Guest process statuses (GuestProcess.Status), as the agent names them.
const (
	GuestCreated = "created"
	GuestRunning = "running"
	GuestStopped = "stopped"
)

// AgentDialer connects to the agent of a started VM (through vmm.DialVsock).
type AgentDialer func(ctx context.Context, vmm VMM) (AgentClient, error)
