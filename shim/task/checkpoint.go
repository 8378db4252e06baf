package task

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/core/runtime"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/cube-runtime/cube/shim/process"
	"github.com/cube-runtime/cube/shim/sandbox"
)

// CheckpointDirName is the subdirectory of a checkpoint path (`ctr task
// checkpoint --image-path DIR`) that holds the VM snapshot; `cube-vmm
// restore DIR/vm` starts a VM from it.
const CheckpointDirName = "vm"

// Checkpoint implements taskAPI: a snapshot of the whole VM (memory, vCPUs,
// devices, a copy of every writable disk). containerd's client pauses the
// task around the call, so the snapshot is of a paused VM, which stays
// paused. Options are containerd's runc CheckpointOptions, as ctr sends them,
// or none (containerd's CRI for a runtime other than runc): Exit ends the
// container afterwards (as runc does without --leave-running); the CRIU-only
// ones (TCP, unix sockets, file locks, …) need nothing here, a VM snapshot
// keeps all of that.
//
// Layout: with an ImagePath (`ctr task checkpoint --image-path DIR`) the
// snapshot goes into DIR/vm. Without one req.Path is containerd's own
// temporary directory, which it tars into its content store; CRI's
// CheckpointContainer then unpacks that tar one regular file per header (a
// subdirectory breaks it), so there the snapshot's files lie flat in req.Path.
// Restore reads either (checkpointVM).
func (s *Service) Checkpoint(ctx context.Context, req *taskAPI.CheckpointTaskRequest) (*emptypb.Empty, error) {
	c, err := s.getContainer(req.ID)
	if err != nil {
		return nil, errOut(err)
	}
	opts, err := checkpointOptions(req)
	if err != nil {
		return nil, errOut(err)
	}
	if req.Path == "" || !filepath.IsAbs(req.Path) {
		return nil, errOut(fmt.Errorf("checkpoint %s: path %q must be an absolute directory (ctr task checkpoint --image-path /abs/dir): %w", req.ID, req.Path, errdefs.ErrInvalidArgument))
	}
	if st := c.init.Status(); st != process.Running && st != process.Paused {
		return nil, errOut(fmt.Errorf("checkpoint %s: it is %s: %w", req.ID, st, errdefs.ErrFailedPrecondition))
	}
	sb, err := s.soleSandbox("checkpoint", req.ID, "a checkpoint captures the whole VM")
	if err != nil {
		return nil, errOut(err)
	}
	if err := os.MkdirAll(req.Path, 0o700); err != nil {
		return nil, errOut(fmt.Errorf("checkpoint %s: %w", req.ID, err))
	}
	flat := opts.ImagePath == ""
	dir := filepath.Join(req.Path, CheckpointDirName)
	for _, p := range []string{dir, filepath.Join(req.Path, "manifest.json")} {
		if _, err := os.Lstat(p); err == nil {
			return nil, errOut(fmt.Errorf("checkpoint %s: %s already holds a checkpoint; choose an empty --image-path: %w", req.ID, p, errdefs.ErrAlreadyExists))
		}
	}
	st, err := sb.Snapshot(ctx, sandbox.SnapshotOptions{Dir: dir, What: "checkpoint of " + req.ID + " into " + dir})
	if err != nil {
		return nil, errOut(fmt.Errorf("checkpoint %s: %w", req.ID, err))
	}
	if flat {
		if err := flattenCheckpoint(dir, req.Path); err != nil {
			return nil, errOut(fmt.Errorf("checkpoint %s: %w", req.ID, err))
		}
		dir = req.Path
	}
	if err := sandbox.WriteHostFacts(req.Path); err != nil {
		// A restore elsewhere then cannot compare CPUs; the checkpoint stands.
		s.o.Log.WithError(err).Warn("checkpoint: this host's CPU not recorded")
	}
	res := st.VMM
	s.o.Log.WithFields(logrus.Fields{"id": req.ID, "dir": dir, "took": st.Total, "vmm_frozen_ms": res.FrozenMS,
		"vmm_total_ms": res.TotalMS, "memory_bytes": res.MemoryBytes, "disk_bytes": res.DiskBytes, "reflinked": res.Reflinked}).Info("checkpoint written")
	s.publish(ctx, runtime.TaskCheckpointedEventTopic, &eventstypes.TaskCheckpointed{ContainerID: req.ID, Checkpoint: dir})
	if opts.Exit {
		// The guest must not run again after the snapshot: its processes end
		// as killed (as CRIU's dump kills them) and the VM is stopped, not
		// resumed to be signalled.
		s.endAll(process.ExitVMGone)
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := sb.Stop(sctx); err != nil {
			s.o.Log.WithError(err).Warn("stop the VM after checkpoint --exit")
		}
	}
	return &emptypb.Empty{}, nil
}

// flattenCheckpoint moves the files of the snapshot directory vm up into
// top (its parent) and removes vm. A snapshot's files are all plain files
// named relative to their directory (hypervisor/snapshot), so they stay a
// valid snapshot in top. A name already in top is refused, not overwritten.
func flattenCheckpoint(vm, top string) error {
	ents, err := os.ReadDir(vm)
	if err != nil {
		return fmt.Errorf("flatten the snapshot into %s: %w", top, err)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			return fmt.Errorf("flatten the snapshot into %s: %s is not a regular file: %w", top, e.Name(), errdefs.ErrFailedPrecondition)
		}
		dst := filepath.Join(top, e.Name())
		if _, err := os.Lstat(dst); err == nil {
			return fmt.Errorf("flatten the snapshot into %s: %s exists already: %w", top, dst, errdefs.ErrAlreadyExists)
		}
		if err := os.Rename(filepath.Join(vm, e.Name()), dst); err != nil {
			return fmt.Errorf("flatten the snapshot into %s: %w", top, err)
		}
	}
	if err := os.Remove(vm); err != nil {
		return fmt.Errorf("flatten the snapshot into %s: %w", top, err)
	}
	return nil
}

// checkpointOptions decodes req.Options: none, or containerd's runc
// CheckpointOptions (what ctr and containerd's client send).
func checkpointOptions(req *taskAPI.CheckpointTaskRequest) (*options.CheckpointOptions, error) {
	if req.Options == nil || len(req.Options.GetValue()) == 0 && req.Options.GetTypeUrl() == "" {
		return &options.CheckpointOptions{}, nil
	}
	v, err := typeurl.UnmarshalAny(req.Options)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: options: %v: %w", req.ID, err, errdefs.ErrInvalidArgument)
	}
	o, ok := v.(*options.CheckpointOptions)
	if !ok {
		return nil, fmt.Errorf("checkpoint %s: options of type %T; io.cube.v1 takes containerd's runc CheckpointOptions (as ctr task checkpoint sends): %w", req.ID, v, errdefs.ErrInvalidArgument)
	}
	return o, nil
}
