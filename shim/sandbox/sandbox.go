// Package sandbox is one microVM per sandbox: it launches and supervises the
// VMM process, dials the guest agent over hybrid vsock, and attaches each
// container's rootfs image as a virtio-blk disk (never mounted on the host).
//
// Disks use pre-created drive slots: the VM boots with DiskSlots drives whose
// serials are fixed ("cube-slot-N"); slot 0 is backed by the first
// container's rootfs image, the others by small stub files in the state dir.
// A later container of the same sandbox (a CRI pod member) gets a free slot
// re-pointed at its image (VMM SetDisk, a media change the guest sees), and
// the agent mounts it by serial.
package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"
)

// State is the VM's lifecycle state.
type State int

const (
	StateNew State = iota
	StateBooting
	StateRunning
	StatePaused
	StateStopped
)

func (s State) String() string {
	switch s {
	case StateNew:
		return "new"
	case StateBooting:
		return "booting"
	case StateRunning:
		return "running"
	case StatePaused:
		return "paused"
	case StateStopped:
		return "stopped"
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// stubSize is the size of an empty slot's backing file: non-zero so a VMM
// that refuses empty disks still starts.
const stubSize = 4096

// SlotSerial is the virtio-blk serial of drive slot n.
func SlotSerial(n int) string { return fmt.Sprintf("cube-slot-%d", n) }

// Options configure a sandbox.
type Options struct {
	ID string
	// Dir is the sandbox's private state dir (sockets, stubs, console log);
	// created by Start, removed by Stop. Keep it short: it holds Unix sockets.
	Dir       string
	Kernel    string
	Initrd    string
	Cmdline   string
	MemoryMiB uint32
	VCPUs     uint32
	DiskSlots int
	// HugeTLB boots the VM with its memory from the hugetlb pool (cube-vmm
	// -hugetlb); a restore ignores it.
	HugeTLB bool
	// Template, when set, is the snapshot the VM is restored from (the
	// shim config's `template`); else TemplateFor may name one at Start.
	Template string
	// TemplateFor, when set, returns the automatic template of this
	// sandbox's shape with nics NICs (shim/template: made on first use).
	// Start calls it for a sandbox a template can serve (no Template, not a
	// restore, no Network or one that is a NICCounter); an error is logged
	// and the VM cold-boots.
	TemplateFor func(ctx context.Context, nics int) (TemplateVM, error)
	// BootTimeout bounds Start until the agent answers Health.
	BootTimeout time.Duration
	VMM         VMM
	Dial        AgentDialer
	// Cgroup the VMM was placed in by the VMM implementation; removed at Stop.
	Cgroup string
	// Network, when set, connects the VM to the host (a CRI pod's CNI
	// network namespace): attached before the VMM starts, configured in the
	// guest before Start returns, detached when the VM is gone.
	Network Network
	// BlockClaimDir holds the host-wide claims on raw block volumes, shared
	// by every shim of the host (default: block-claims beside Dir).
	BlockClaimDir string
	// HostBlockDevice finds a host block device's node and size by its
	// numbers (default HostBlockDevice; tests fake it).
	HostBlockDevice func(major, minor uint32) (string, uint64, error)
	Log             *logrus.Entry
	// Standby: a sandbox restored from a template adopts a standby VM of
	// it when one is free, and leaves one behind for the next sandbox
	// (standby.go, docs/shim.md *Standby VMs*).
	Standby bool
}

// Sandbox is one VM and its agent connection.
type Sandbox struct {
	o Options

	mu    sync.Mutex
	state State
	agent AgentClient
	slots []slot
	// blockVols: raw block volumes attached through slots (blockvol.go).
	blockVols []BlockVolume
	stopping  bool
	frozen    bool          // Pause froze the guest's filesystems; Resume thaws them
	op        *runningOp    // the snapshot (or rollback) in progress: one at a time
	base      string        // the VM's last snapshot: the parent of its next incremental one
	done      chan struct{} // closed after the VMM is gone and cleanup ran
	exit      VMExit
	unexpect  bool
	restore   *RestoreFrom // StartRestore's checkpoint
	share     bool         // the VM has the virtio-fs share (share.go)
	shareSeq  int          // names of share entries: v1, v2, …
	shared    []SharedDir  // host directories in the share now

	// templateNICs are the NIC MACs of the automatic template chooseTemplate picked.
	templateNICs []string
	// standbyMade is closed when the standby Start leaves (makeStandby) is
	// published, or was not made.
	standbyMade chan struct{}
}

// RestoreFrom is a checkpoint StartRestore brings back instead of booting:
// the VM snapshot of a Cube sandbox whose drives are the slots
// cube-slot-0..N-1, one of which holds the checkpointed container's rootfs.
type RestoreFrom struct {
	// Dir is the VM snapshot (absolute).
	Dir string
	// Slots is the number of drive slots the snapshot has.
	Slots int
	// RootfsSerial is the slot of the checkpointed container's rootfs.
	RootfsSerial string
	// RootfsImage is where that disk's working copy goes: the new
	// container's rootfs image (replaced by a reflink or copy of the
	// snapshot's disk, which the guest's page cache describes).
	RootfsImage string
	// Owner is the new container's id.
	Owner string
	// NICMACs are the MACs of the snapshot's virtio-net devices, in order
	// (its guest still has them). The sandbox's Network must give as many
	// NICs: each replaces the snapshot's tap, and the agent moves the guest
	// interface to the new MAC and address (a restored or forked sandbox
	// has its own; nothing of the source's network identity stays).
	NICMACs []string
	// Shares bind the new container's host directories at the share
	// entries the snapshot recorded (SharesName: same Name, the new Host);
	// every recorded entry must be given (sharerec.go).
	Shares []ShareRecord
}

// StartRestore restores the VM from r instead of booting it (memory mapped
// from the snapshot's files, disks copied: see RestoreFrom) and waits for
// the agent; the guest's filesystems are thawed (a checkpoint of a paused
// VM holds them frozen), its clock stepped and its RNG reseeded.
func (s *Sandbox) StartRestore(ctx context.Context, r RestoreFrom) error {
	if r.Dir == "" || r.Slots < 1 || r.RootfsSerial == "" || r.RootfsImage == "" || r.Owner == "" {
		return fmt.Errorf("sandbox %s: restore: incomplete %+v: %w", s.o.ID, r, errdefs.ErrInvalidArgument)
	}
	s.mu.Lock()
	s.restore = &r
	s.o.Template, s.o.DiskSlots = r.Dir, r.Slots
	s.mu.Unlock()
	return s.Start(ctx, "", "")
}

type slot struct {
	serial, stub string
	owner        string // container id using it, "" when free
	vol          string // container path of the raw block volume in it, "" for a rootfs
	mountPoint   string
}

// New returns a sandbox in StateNew.
func New(o Options) (*Sandbox, error) {
	if o.ID == "" || o.Dir == "" || o.VMM == nil || o.Dial == nil {
		return nil, errors.New("sandbox: id, dir, vmm and dialer are required")
	}
	if o.DiskSlots < 1 {
		return nil, fmt.Errorf("sandbox %s: %d disk slots", o.ID, o.DiskSlots)
	}
	if o.Log == nil {
		o.Log = logrus.NewEntry(logrus.StandardLogger())
	}
	if o.BootTimeout <= 0 {
		o.BootTimeout = 30 * time.Second
	}
	return &Sandbox{o: o, done: make(chan struct{})}, nil
}

// ID returns the sandbox id.
func (s *Sandbox) ID() string { return s.o.ID }

// Dir returns the sandbox's state dir.
func (s *Sandbox) Dir() string { return s.o.Dir }

// Cgroup returns the VMM's cgroup ("" when not placed).
func (s *Sandbox) Cgroup() string { return s.o.Cgroup }

// State returns the lifecycle state.
func (s *Sandbox) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// Pid returns the VMM's host pid.
func (s *Sandbox) Pid() int { return s.o.VMM.Pid() }

// Agent returns the agent client (nil before Start succeeded).
func (s *Sandbox) Agent() AgentClient {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.agent
}

// Done is closed once the VM is gone (stopped or died) and its resources are cleaned.
func (s *Sandbox) Done() <-chan struct{} { return s.done }

// Exit reports how the VM ended and whether that was unexpected (not Stop).
func (s *Sandbox) Exit() (VMExit, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exit, s.unexpect
}

// supervise waits for the VMM to go away and cleans up; an exit not asked for
// by Stop is recorded as unexpected.
func (s *Sandbox) supervise() {
	<-s.o.VMM.Wait()
	s.mu.Lock()
	stopping := s.stopping
	s.mu.Unlock()
	if !stopping {
		s.o.Log.WithField("status", s.o.VMM.Exit().describe()).Error("vmm exited unexpectedly")
		s.logConsoleTail("its vmm exited unexpectedly")
	}
	s.teardown(!stopping)
}

// teardown closes the agent, removes sockets, stubs and the state dir and
// the cgroup, then closes Done. Idempotent.
func (s *Sandbox) teardown(unexpected bool) {
	s.mu.Lock()
	if s.state == StateStopped {
		s.mu.Unlock()
		return
	}
	s.state = StateStopped
	s.unexpect = unexpected
	agent := s.agent
	s.mu.Unlock()
	if agent != nil {
		agent.Close()
	}
	// The VMM must be gone before its sockets and disks are removed.
	if w := s.o.VMM.Wait(); w != nil {
		select {
		case <-w:
		default:
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = s.o.VMM.Stop(ctx)
			cancel()
			<-w
		}
	}
	// Ordering: the VMM is gone, so no guest writes a raw block volume any
	// more: its claim can go.
	s.releaseBlockVolumes()
	// Ordering: the VMM is gone, so the taps are too; then the tc rules on
	// the CNI interface that pointed at them.
	s.detachNetwork()
	// Ordering: the binds of host directories go before the state dir, or
	// removing it would remove the host directories' contents.
	if err := ReleaseShareDir(s.o.Dir); err != nil {
		s.o.Log.WithError(err).Error("host directories still bound in the sandbox's virtio-fs share: state dir left in place")
	} else if err := os.RemoveAll(s.o.Dir); err != nil {
		s.o.Log.WithError(err).Warn("remove sandbox state dir")
	}
	if s.o.Cgroup != "" {
		if err := RemoveCgroup(s.o.Cgroup); err != nil {
			s.o.Log.WithError(err).Debug("remove vmm cgroup")
		}
	}
	s.mu.Lock()
	s.exit = s.o.VMM.Exit()
	s.mu.Unlock()
	close(s.done)
}

// mountRootfs mounts the rootfs disk in slot serial in the guest and logs
// "rootfs attached" with steps (which may hold earlier steps of the attach).
func (s *Sandbox) mountRootfs(ctx context.Context, agent AgentClient, containerID, serial string, steps *Steps) (string, error) {
	md, err := agent.MountDisk(ctx, rootfsMountRequest(serial))
	steps.Mark("mount")
	s.logRootfsAttached(containerID, serial, steps, md)
	return md.MountPoint, err
}

// rootfsMountRequest mounts a container's rootfs image found by serial.
// noinit_itable: no ext4lazyinit thread zeroing the image's lazily
// initialized inode tables (mkfs -E lazy_itable_init=1) behind the
// container's back: CPU the guest needs, and writes that unshare the
// image's reflinked blocks.
func rootfsMountRequest(serial string) MountDiskRequest {
	return MountDiskRequest{Serial: serial, FSType: "ext4", Options: []string{"noinit_itable"}}
}

// logRootfsAttached logs a rootfs mount with the host's and the guest's
// timings.
func (s *Sandbox) logRootfsAttached(containerID, serial string, steps *Steps, md MountedDisk) {
	s.o.Log.WithFields(logrus.Fields{"container": containerID, "serial": serial, "steps_ms": steps.String(),
		"guest_ms": md.Timing}).Info("rootfs attached")
}

// AttachRootfs gives containerID's rootfs image to the guest and mounts it
// there; it returns the guest mount point. The container that booted the VM
// already owns slot 0.
func (s *Sandbox) AttachRootfs(ctx context.Context, containerID, image string) (string, error) {
	s.mu.Lock()
	agent := s.agent
	idx := -1
	for i := range s.slots {
		if s.slots[i].owner == containerID && s.slots[i].vol == "" {
			idx = i
			break
		}
	}
	fresh := idx < 0
	if !fresh && s.slots[idx].mountPoint != "" {
		// Mounted when the VM started (freshenAndMount).
		mp := s.slots[idx].mountPoint
		s.mu.Unlock()
		return mp, nil
	}
	if fresh {
		for i := range s.slots {
			if s.slots[i].owner == "" {
				idx = i
				s.slots[i].owner = containerID
				break
			}
		}
	}
	s.mu.Unlock()
	if agent == nil {
		return "", fmt.Errorf("sandbox %s is not running", s.o.ID)
	}
	if idx < 0 {
		return "", fmt.Errorf("sandbox %s: all %d disk slots are in use (raise disk_slots in the shim config): %w", s.o.ID, len(s.slots), errdefs.ErrResourceExhausted)
	}
	release := func() {
		s.mu.Lock()
		s.slots[idx].owner = ""
		s.mu.Unlock()
	}
	serial := s.slots[idx].serial
	steps := NewSteps(time.Now())
	if fresh {
		if err := s.o.VMM.SetDisk(ctx, serial, image, false); err != nil {
			release()
			return "", fmt.Errorf("attach rootfs of %s: %w", containerID, err)
		}
		steps.Mark("disk-set")
	}
	mp, err := s.mountRootfs(ctx, agent, containerID, serial, steps)
	if err != nil {
		if fresh {
			_ = s.o.VMM.SetDisk(ctx, serial, s.slots[idx].stub, false)
		}
		release()
		return "", fmt.Errorf("mount rootfs of %s in the guest: %w", containerID, err)
	}
	s.mu.Lock()
	s.slots[idx].mountPoint = mp
	s.mu.Unlock()
	return mp, nil
}

// DetachRootfs unmounts containerID's rootfs in the guest and points its slot
// back at the stub. Nothing to do once the VM is gone.
func (s *Sandbox) DetachRootfs(ctx context.Context, containerID string) error {
	s.mu.Lock()
	idx := -1
	for i := range s.slots {
		if s.slots[i].owner == containerID && s.slots[i].vol == "" {
			idx = i
		}
	}
	agent, st := s.agent, s.state
	s.mu.Unlock()
	if idx < 0 {
		return nil
	}
	defer func() {
		s.mu.Lock()
		s.slots[idx].owner, s.slots[idx].mountPoint = "", ""
		s.mu.Unlock()
	}()
	if st == StateStopped || agent == nil {
		return nil
	}
	sl := s.slots[idx]
	if sl.mountPoint != "" {
		if err := agent.UnmountDisk(ctx, sl.mountPoint); err != nil {
			return fmt.Errorf("unmount rootfs of %s in the guest: %w", containerID, err)
		}
	}
	// The guest no longer uses the image: re-point the slot so the
	// snapshotter can remove the file and the next container can take it.
	if err := s.o.VMM.SetDisk(ctx, sl.serial, sl.stub, false); err != nil {
		return fmt.Errorf("detach rootfs of %s: %w", containerID, err)
	}
	return nil
}

// Pause freezes the whole VM: first the guest's filesystems (FIFREEZE), then
// its vCPUs.
//
// Ordering: the filesystems freeze while the guest still runs (the agent must
// answer), and before the vCPUs stop. A frozen ext4 is clean on disk — journal
// flushed, no recovery needed — so whatever reads a paused sandbox's rootfs
// image on the host sees a consistent filesystem: containerd's rw-layer diff of
// `ctr task checkpoint` mounts that image read-only with noload while the VM is
// paused, and without the freeze it read half-written metadata ("bad
// message"). A guest that cannot freeze (agent gone or stalled) is paused
// anyway, with a warning: pausing must not depend on the guest's cooperation.
func (s *Sandbox) Pause(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != StateRunning {
		return fmt.Errorf("sandbox %s: pause in state %s", s.o.ID, s.state)
	}
	if s.agent != nil {
		if err := s.agent.FreezeFilesystems(ctx); err != nil {
			s.o.Log.WithError(err).Warn("pause: guest filesystems not frozen; a host-side read of a rootfs image may see an unclean journal")
		} else {
			s.frozen = true
		}
	}
	if err := s.o.VMM.Pause(ctx); err != nil {
		s.thawLocked(ctx, "pause failed")
		return fmt.Errorf("sandbox %s: pause: %w", s.o.ID, err)
	}
	s.state = StatePaused
	return nil
}

// Resume continues a paused VM and thaws what Pause froze.
//
// Ordering: the vCPUs run again before the thaw, which the agent performs.
func (s *Sandbox) Resume(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != StatePaused {
		return fmt.Errorf("sandbox %s: resume in state %s", s.o.ID, s.state)
	}
	if err := s.o.VMM.Resume(ctx); err != nil {
		return fmt.Errorf("sandbox %s: resume: %w", s.o.ID, err)
	}
	s.state = StateRunning
	s.thawLocked(ctx, "resume")
	return nil
}

// thawLocked thaws the filesystems Pause froze. The VM runs by then, so a
// failure cannot undo anything: it is logged as an error (writes in the guest
// block until the filesystems thaw).
func (s *Sandbox) thawLocked(ctx context.Context, why string) {
	if !s.frozen || s.agent == nil {
		return
	}
	if err := s.agent.ThawFilesystems(ctx); err != nil {
		s.o.Log.WithError(err).WithField("after", why).Error("guest filesystems stay frozen: writes in the sandbox block until they thaw")
		return
	}
	s.frozen = false
}

// Stop powers the VM off (agent PowerOff, then the VMM's stop, then SIGKILL
// when ctx ends) and waits until its resources are cleaned.
func (s *Sandbox) Stop(ctx context.Context) error {
	s.mu.Lock()
	if s.state == StateNew {
		s.state = StateStopped
		s.mu.Unlock()
		close(s.done)
		return nil
	}
	s.stopping = true
	agent, st := s.agent, s.state
	s.mu.Unlock()
	steps := NewSteps(time.Now())
	if agent != nil && st == StateRunning {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		// The reply may never come: the guest powers off underneath it.
		_ = agent.SyncFilesystems(pctx)
		cancel()
		steps.Mark("sync")
	}
	if err := s.o.VMM.Stop(ctx); err != nil {
		s.o.Log.WithError(err).Warn("stop vmm")
	}
	steps.Mark("vmm")
	s.teardown(false)
	<-s.done
	steps.Mark("teardown")
	// Ordering: a standby still being made when the shim exits after this
	// Stop would be left half made: a directory, maybe a VMM, no record.
	s.mu.Lock()
	made := s.standbyMade
	s.mu.Unlock()
	if made != nil {
		<-made
		steps.Mark("standby")
	}
	s.o.Log.WithFields(logrus.Fields{"sandbox": s.o.ID, "total_ms": MS(steps.Total()), "steps_ms": steps.String()}).Info("sandbox stopped")
	return nil
}

// Record is what the shim writes into a container bundle so that the
// `delete` action of a restarted shim can clean up after a crash.
type Record struct {
	SandboxID string `json:"sandbox_id"`
	Dir       string `json:"dir"`
	VMMPid    int    `json:"vmm_pid"`
	Cgroup    string `json:"cgroup,omitempty"`
}

// RecordFile is the record's name in the bundle.
const RecordFile = "cube-sandbox.json"

// WriteRecord stores r in bundle.
func WriteRecord(bundle string, r Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp := filepath.Join(bundle, RecordFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write sandbox record: %w", err)
	}
	return os.Rename(tmp, filepath.Join(bundle, RecordFile))
}

// ReadRecord loads the record from bundle.
func ReadRecord(bundle string) (Record, error) {
	var r Record
	b, err := os.ReadFile(filepath.Join(bundle, RecordFile))
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("parse %s: %w", RecordFile, err)
	}
	return r, nil
}

// restoreNICs matches a restore's network to its snapshot's devices: as many
// NICs as the snapshot had (a restored VM can neither gain nor lose one),
// each interface found in the guest by the snapshot's MAC (DeviceMAC) and
// moved to the new one.
func restoreNICs(r *RestoreFrom, a *NetworkAttachment) error {
	n := 0
	if a != nil {
		n = len(a.NICs)
	}
	if n != len(r.NICMACs) {
		return fmt.Errorf("restore of %s: its VM had %d network devices, the new container's network gives %d (a restored VM keeps its devices: give the new container a network like the checkpointed one's, or none if it had none): %w",
			r.Dir, len(r.NICMACs), n, errdefs.ErrFailedPrecondition)
	}
	if n == 0 {
		return nil
	}
	if len(a.Guest.Interfaces) != n {
		return fmt.Errorf("restore of %s: %d NICs but %d guest interfaces to configure: %w", r.Dir, n, len(a.Guest.Interfaces), errdefs.ErrInvalidArgument)
	}
	for i := range a.Guest.Interfaces {
		a.Guest.Interfaces[i].DeviceMAC = r.NICMACs[i]
	}
	return nil
}
