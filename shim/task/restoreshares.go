package task

import (
	"fmt"
	"os"
	"path"
	"slices"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cube-runtime/cube/shim/sandbox"
)

// restoreShares matches the host directories a VM snapshot had shared with
// its guest (sandbox.SharesName, beside the snapshot) to the new
// container's bind mounts by destination: each becomes a bind of the new
// mount's host directory at the snapshot's share entry, which the restored
// guest's mount and open files go through (docs/shim.md, "Volumes"). It
// returns them and their guest paths (released when the container is
// deleted). A recorded share without a bind mount of a host directory at
// its destination in the new spec is FailedPrecondition naming it and the
// fix; the host directory itself may be another one (a restore elsewhere).
func restoreShares(vm, id string, spec *specs.Spec) ([]sandbox.ShareRecord, []string, error) {
	recs, err := sandbox.ReadShares(vm)
	if err != nil || len(recs) == 0 {
		return nil, nil, err
	}
	var binds []sandbox.ShareRecord
	var guest []string
	for _, r := range recs {
		m := sharedMountAt(spec, r.Destination)
		if m == nil {
			return nil, nil, fmt.Errorf("checkpoint %s had %s shared with its VM (guest entry %s); the new container's spec has no bind mount of a host directory at %s: add one (a hostPath or PVC volume at %s, or ctr --mount type=bind,src=DIR,dst=%s,options=rbind): %w",
				vm, r.Ref, r.Name, r.Destination, r.Destination, r.Destination, errdefs.ErrFailedPrecondition)
		}
		ro := slices.Contains(m.Options, "ro")
		binds = append(binds, sandbox.ShareRecord{Name: r.Name, Host: m.Source, ReadOnly: ro, Container: id,
			Destination: r.Destination, Ref: "host directory " + m.Source + " at " + r.Destination})
		guest = append(guest, path.Join(sandbox.GuestShareRoot, r.Name))
	}
	return binds, guest, nil
}

// sharedMountAt is the spec's bind mount of a host directory at dest.
func sharedMountAt(spec *specs.Spec, dest string) *specs.Mount {
	if spec == nil {
		return nil
	}
	for i := range spec.Mounts {
		m := &spec.Mounts[i]
		if !isBind(m) || path.Clean(m.Destination) != dest {
			continue
		}
		if fi, err := os.Stat(m.Source); err == nil && fi.IsDir() {
			return m
		}
	}
	return nil
}
