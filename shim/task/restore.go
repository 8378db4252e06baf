package task

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/v2/core/runtime"
	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/shim/config"
	"github.com/cube-runtime/cube/shim/process"
	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/stdio"
)

// Create from a checkpoint (docs/shim.md, "Restore"): containerd hands the
// shim a directory in CreateTaskRequest.Checkpoint — the criu.tar of `ctr
// containers checkpoint --task` unpacked by containerd, or runc's
// Options.CriuImagePath as given (`cube restore` points it at a store
// snapshot: nothing is copied) — holding the VM snapshot in vm/ (or at its
// top). The shim restores that VM instead of booting one (memory mapped from
// the snapshot's files, the rootfs disk reflinked or copied over the new
// container's rootfs image), renames the guest's container to the new id,
// adopts its init, and keeps the VM paused: the task is CREATED, and Start
// resumes it, as runc's shim restores on Start.

// containerdCheckpointPrefix names the temporary directories containerd
// unpacks a checkpoint's criu.tar into (and never removes).
const containerdCheckpointPrefix = "ctrd-checkpoint"

// checkpointVM finds the VM snapshot in a checkpoint directory: dir/vm, or
// dir itself. unpacked says that dir is containerd's own temporary copy,
// which the shim removes once the VM is restored (the VM keeps its memory
// files open; a removed file lives on while mapped).
func checkpointVM(dir string) (vm string, unpacked bool, err error) {
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
		return "", false, fmt.Errorf("checkpoint %q: want an absolute, clean directory: %w", dir, errdefs.ErrInvalidArgument)
	}
	for _, cand := range []string{filepath.Join(dir, CheckpointDirName), dir} {
		if _, err := os.Stat(filepath.Join(cand, snapshot.ManifestName)); err == nil {
			// containerd's copy holds vm/ (older checkpoints) or the snapshot flat
			// (a checkpoint without an ImagePath: shim/task/checkpoint.go).
			unpacked = strings.HasPrefix(filepath.Base(dir), containerdCheckpointPrefix)
			return cand, unpacked, nil
		}
	}
	return "", false, fmt.Errorf("checkpoint %s holds no VM snapshot (%s/%s or %s): a checkpoint of an io.cube.v1 task (`ctr containers checkpoint --task`) or a snapshot of the store is needed: %w",
		dir, CheckpointDirName, snapshot.ManifestName, snapshot.ManifestName, errdefs.ErrInvalidArgument)
}

// restorePlan is what a checkpoint's manifest says about the restore.
type restorePlan struct {
	slots        int
	rootfsSerial string
	// nicMACs are the snapshot's virtio-net devices' MACs, in order.
	nicMACs []string
}

// vmmNets is the part of cube-vmm's configuration (recorded in the
// manifest) that says which network devices the VM had.
type vmmNets struct {
	Net []struct {
		MAC string
	}
}

// manifestNICMACs are the MACs of a VM snapshot's virtio-net devices, in
// order, from cube-vmm's configuration in its manifest.
func manifestNICMACs(m *snapshot.Manifest) ([]string, error) {
	var nets vmmNets
	if len(m.Config) > 0 {
		if err := json.Unmarshal(m.Config, &nets); err != nil {
			return nil, fmt.Errorf("the VMM configuration in its manifest: %v: %w", err, errdefs.ErrFailedPrecondition)
		}
	}
	var macs []string
	for i, n := range nets.Net {
		if n.MAC == "" {
			return nil, fmt.Errorf("network device %d has no MAC in the manifest: %w", i, errdefs.ErrFailedPrecondition)
		}
		macs = append(macs, n.MAC)
	}
	return macs, nil
}

// planRestore reads the VM snapshot's manifest and refuses what cannot be
// restored here, with the reason: another snapshot format, another guest
// kernel than the configured one, another CPU than this host's (when the
// checkpoint recorded it), or a VM that is not a single-container Cube
// sandbox. (cube-vmm itself refuses a snapshot of another VMM version.)
func planRestore(vm string, cfg config.Config, here *sandbox.HostFacts) (restorePlan, error) {
	b, err := os.ReadFile(filepath.Join(vm, snapshot.ManifestName))
	if err != nil {
		return restorePlan{}, fmt.Errorf("checkpoint: %w", err)
	}
	m, err := snapshot.ParseManifest(b)
	if err != nil {
		return restorePlan{}, fmt.Errorf("checkpoint %s: %w: %w", vm, err, errdefs.ErrFailedPrecondition)
	}
	if m.Components.VMMVersion != snapshot.VMMVersion() {
		return restorePlan{}, fmt.Errorf("checkpoint %s was made by %q, this node's shim is built with %q: a snapshot restores only into the VMM version that wrote it: %w",
			vm, m.Components.VMMVersion, snapshot.VMMVersion(), errdefs.ErrFailedPrecondition)
	}
	if want := m.Components.KernelSHA256; want != "" {
		got, err := fileSHA256(cfg.Kernel)
		if err != nil {
			return restorePlan{}, fmt.Errorf("checkpoint %s: the configured guest kernel: %w", vm, err)
		}
		if got != want {
			return restorePlan{}, fmt.Errorf("checkpoint %s ran guest kernel sha256 %s, this node's configured kernel %s is %s: restore it where that kernel is configured: %w",
				vm, want, cfg.Kernel, got, errdefs.ErrFailedPrecondition)
		}
	}
	if here != nil {
		// In the VM snapshot (the snapshot service's), or beside it (a checkpoint's).
		for _, p := range []string{filepath.Join(vm, sandbox.HostFactsName), filepath.Join(filepath.Dir(vm), sandbox.HostFactsName)} {
			then, err := sandbox.ReadHostFacts(p)
			if err != nil {
				return restorePlan{}, fmt.Errorf("checkpoint %s: %w", vm, err)
			}
			if then == nil {
				continue
			}
			if err := then.CompatibleWith(*here); err != nil {
				return restorePlan{}, fmt.Errorf("checkpoint %s: %w: %w", vm, err, errdefs.ErrFailedPrecondition)
			}
			break
		}
	}
	p := restorePlan{slots: len(m.Shape.Disks)}
	if p.nicMACs, err = manifestNICMACs(m); err != nil {
		return restorePlan{}, fmt.Errorf("checkpoint %s: %w", vm, err)
	}
	for i, d := range m.Shape.Disks {
		if d.Serial != sandbox.SlotSerial(i) {
			return restorePlan{}, fmt.Errorf("checkpoint %s: disk %d has serial %q, not %q: not a snapshot of a Cube sandbox's VM: %w",
				vm, i, d.Serial, sandbox.SlotSerial(i), errdefs.ErrFailedPrecondition)
		}
		// A slot without a container is backed by its stub, slot-N.img.
		if d.ReadOnly || filepath.Base(d.Source) == fmt.Sprintf("slot-%d.img", i) {
			continue
		}
		if p.rootfsSerial != "" {
			return restorePlan{}, fmt.Errorf("checkpoint %s: drives %s and %s both hold a container's rootfs: a VM running several containers (a pod) is restored as a whole, not as one container: %w",
				vm, p.rootfsSerial, d.Serial, errdefs.ErrFailedPrecondition)
		}
		p.rootfsSerial = d.Serial
	}
	if p.rootfsSerial == "" {
		return restorePlan{}, fmt.Errorf("checkpoint %s: no drive holds a container's rootfs: %w", vm, errdefs.ErrFailedPrecondition)
	}
	return p, nil
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// createFromCheckpoint is Create with req.Checkpoint set (see above).
func (s *Service) createFromCheckpoint(ctx context.Context, req *taskAPI.CreateTaskRequest) (_ *taskAPI.CreateTaskResponse, retErr error) {
	image, err := rootfsImage(req.Rootfs)
	if err != nil {
		return nil, err
	}
	_, spec, err := readSpec(req.Bundle)
	if err != nil {
		return nil, err
	}
	if v := spec.Annotations[SandboxIDAnnotation]; v != "" && v != req.ID {
		return nil, fmt.Errorf("restore %s into pod %s: a checkpoint restores a whole VM, not a member of another pod's VM: %w", req.ID, v, errdefs.ErrNotImplemented)
	}
	if devs, err := sandbox.BlockDevices(spec); err != nil {
		return nil, err
	} else if len(devs) > 0 {
		return nil, fmt.Errorf("restore %s: block device %s: a container restored from a checkpoint cannot be given raw block volumes (a checkpoint never holds one, and the restored guest does not apply the spec again); restore it without volumeDevices: %w",
			req.ID, devs[0].Path, errdefs.ErrFailedPrecondition)
	}
	vm, unpacked, err := checkpointVM(req.Checkpoint)
	if err != nil {
		return nil, err
	}
	opts, err := decodeOptions(req)
	if err != nil {
		return nil, err
	}
	cfg, err := s.loadConfig(opts)
	if err != nil {
		return nil, err
	}
	here, err := sandbox.CurrentHostFacts()
	if err != nil {
		s.o.Log.WithError(err).Warn("restore: this host's CPU is not known; the checkpoint's is not compared")
		here = nil
	}
	plan, err := planRestore(vm, cfg, here)
	if err != nil {
		return nil, err
	}
	shares, sharedGuest, err := restoreShares(vm, req.ID, spec)
	if err != nil {
		return nil, err
	}

	s.bootMu.Lock()
	defer s.bootMu.Unlock()
	s.mu.Lock()
	if _, ok := s.containers[req.ID]; ok {
		s.mu.Unlock()
		return nil, fmt.Errorf("container %s: %w", req.ID, errdefs.ErrAlreadyExists)
	}
	if s.sb != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("restore %s: this shim already runs sandbox %s; a checkpoint restores into a VM of its own: %w", req.ID, s.sb.ID(), errdefs.ErrFailedPrecondition)
	}
	s.containers[req.ID] = nil
	s.mu.Unlock()
	defer func() {
		if retErr != nil {
			s.mu.Lock()
			if s.containers[req.ID] == nil {
				delete(s.containers, req.ID)
			}
			s.mu.Unlock()
		}
	}()

	start := time.Now()
	sb, err := s.o.NewSandbox(ctx, req.ID, cfg, spec, req.Bundle)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", req.ID, err)
	}
	if err := sb.StartRestore(ctx, sandbox.RestoreFrom{Dir: vm, Slots: plan.slots, RootfsSerial: plan.rootfsSerial, RootfsImage: image, Owner: req.ID, NICMACs: plan.nicMACs, Shares: shares}); err != nil {
		return nil, fmt.Errorf("restore %s from %s: %w", req.ID, vm, err)
	}
	s.mu.Lock()
	s.sb = sb
	s.mu.Unlock()
	go s.watchSandbox(sb)
	defer func() {
		if retErr != nil {
			s.mu.Lock()
			s.sb = nil
			s.mu.Unlock()
			_ = sb.Stop(context.WithoutCancel(ctx))
		}
	}()
	if err := sandbox.WriteRecord(req.Bundle, sandbox.Record{SandboxID: sb.ID(), Dir: sb.Dir(), VMMPid: sb.Pid(), Cgroup: sb.Cgroup()}); err != nil {
		return nil, err
	}
	uris := stdioURIs{stdin: req.Stdin, stdout: req.Stdout, stderr: req.Stderr, terminal: req.Terminal || spec.Process.Terminal}
	p, adopted, err := s.adoptRestored(ctx, sb, req.ID, uris)
	if err != nil {
		return nil, fmt.Errorf("restore %s from %s: %w", req.ID, vm, err)
	}
	// Created from a checkpoint: the guest waits, paused, for Start.
	if err := sb.Pause(ctx); err != nil {
		return nil, fmt.Errorf("restore %s: keep the restored VM paused until start: %w", req.ID, err)
	}
	c := &container{id: req.ID, bundle: req.Bundle, rootfs: image, stdio: uris, init: p, execs: map[string]*execProc{},
		volumes: volumeUse{shared: sharedGuest}}
	s.mu.Lock()
	s.containers[req.ID] = c
	s.mu.Unlock()
	if unpacked {
		// containerd's temporary copy of the checkpoint: the VM maps its
		// memory files (they live on while mapped) and has its own disks.
		if err := os.RemoveAll(req.Checkpoint); err != nil {
			s.o.Log.WithError(err).Warn("restore: remove containerd's unpacked checkpoint")
		}
	}
	s.o.Log.WithFields(logrus.Fields{"container": req.ID, "checkpoint": vm, "guest_container": adopted, "vmm_pid": sb.Pid(),
		"took": time.Since(start)}).Info("restored from checkpoint; paused until start")
	pid := s.hostPid()
	s.publish(ctx, runtime.TaskCreateEventTopic, &eventstypes.TaskCreate{
		ContainerID: req.ID, Bundle: req.Bundle, Rootfs: req.Rootfs, Checkpoint: req.Checkpoint,
		IO:  &eventstypes.TaskIO{Stdin: req.Stdin, Stdout: req.Stdout, Stderr: req.Stderr, Terminal: uris.terminal},
		Pid: pid,
	})
	return &taskAPI.CreateTaskResponse{Pid: pid}, nil
}

// adoptRestored takes over the restored guest's container under id: the
// agent renames it (it knows the checkpointed container's id), its init
// becomes the task's process (stdio re-attached to the new task's), and the
// output of its execs, which containerd does not know, is drained. It
// returns the process and the guest container's old id.
func (s *Service) adoptRestored(ctx context.Context, sb *sandbox.Sandbox, id string, uris stdioURIs) (*process.Process, string, error) {
	agent := sb.Agent()
	guest, err := agent.ListProcesses(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("list the restored guest's processes: %w", err)
	}
	old, err := soleGuestContainer(guest)
	if err != nil {
		return nil, "", err
	}
	if old != id {
		if err := agent.RenameContainer(ctx, old, id); err != nil {
			return nil, old, fmt.Errorf("rename the guest's container %s to %s (an agent older than the RenameContainer RPC cannot be restored under a new id): %w", old, id, err)
		}
	}
	var init *sandbox.GuestProcess
	for i := range guest {
		guest[i].ContainerID = id
		if guest[i].ExecID == "" {
			init = &guest[i]
		}
	}
	if init == nil || init.Status != sandbox.GuestRunning {
		st := "gone"
		if init != nil {
			st = init.Status
		}
		return nil, old, fmt.Errorf("the checkpointed container's init is %s in the guest; only a running container is restored: %w", st, errdefs.ErrFailedPrecondition)
	}
	log := s.o.Log.WithField("container", id)
	cfg := stdio.Config{Stdin: uris.stdin, Stdout: uris.stdout, Stderr: uris.stderr, Terminal: uris.terminal}
	hio, err := stdio.Open(ctx, id, s.o.Namespace, cfg, log)
	if err != nil {
		return nil, old, err
	}
	hio.Attach(s.reattachStreams(ctx, agent, *init, log))
	for _, g := range guest {
		if g.ExecID != "" && g.Status != sandbox.GuestStopped {
			glog := log.WithFields(logrus.Fields{"exec": g.ExecID, "pid": g.Pid})
			glog.Info("restore: the checkpoint's exec runs on, unknown to containerd (its output is discarded; list and signal it through the snapshot service)")
			s.drainOutput(ctx, agent, g, glog)
		}
	}
	p := process.NewRestored(process.Options{
		ContainerID: id, Agent: agent, IO: hio, GuestPid: init.Pid,
		VMDone: sb.Done(), OnExit: s.processExited, Log: log,
	}, sb.Resume)
	return p, old, nil
}

// soleGuestContainer is the one container the restored guest runs.
func soleGuestContainer(guest []sandbox.GuestProcess) (string, error) {
	ids := map[string]bool{}
	var first string
	for _, g := range guest {
		if !ids[g.ContainerID] {
			ids[g.ContainerID] = true
			if first == "" {
				first = g.ContainerID
			}
		}
	}
	switch len(ids) {
	case 0:
		return "", fmt.Errorf("the restored guest runs no container: %w", errdefs.ErrFailedPrecondition)
	case 1:
		return first, nil
	}
	return "", fmt.Errorf("the restored guest runs %d containers: a checkpoint of one container's VM is restored, not a pod's: %w", len(ids), errdefs.ErrFailedPrecondition)
}
