package snapshots

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/checkpoint/store"
	api "github.com/cube-runtime/cube/shim/snapshotapi"
)

// RollbackShim is the part of the shim's snapshot service Rollback uses
// (checkpoint/shimclient.Client; a fake in tests).
type RollbackShim interface {
	List(ctx context.Context, req *api.ListRequest) (*api.ListResponse, error)
	Rollback(ctx context.Context, req *api.RollbackRequest) (*api.RollbackResponse, error)
}

// RollbackOptions say what to roll back to.
type RollbackOptions struct {
	// Container is any container of the sandbox (its VM rolls back whole).
	Container string
	// Sandbox is the store's name of the sandbox (SandboxKey).
	Sandbox string
	// Ref is the snapshot: its id or one of its names.
	Ref string
}

// RolledBack is a rollback's outcome.
type RolledBack struct {
	// Snapshot is the store's snapshot the VM rolled back to.
	Snapshot store.Snapshot
	// VM is the shim's account: timings, memory mode, the processes.
	VM *api.RollbackResponse
	// Released lists the snapshots whose reference the sandbox dropped (the
	// one its VM held before).
	Released []string
	// Warnings: references that could not be dropped (the store's next
	// Collect drops them once the VM is gone).
	Warnings []string
}

// Holder is the name under which a sandbox's VM holds references to the
// snapshots it maps ("sandbox default/c1").
func Holder(sandbox string) string { return "sandbox " + sandbox }

// Rollback rolls the sandbox of o.Container back in place to the store's
// snapshot o.Ref through the shim's service. The VM maps the snapshot's
// memory files from then on (and it becomes its parent), so the sandbox
// takes a reference to it in the store, held by the VMM's pid: deleting the
// snapshot is refused while the VM runs. The reference to the snapshot the
// VM held before, if any, is released once the rollback succeeded.
func Rollback(ctx context.Context, st *store.Store, sh RollbackShim, o RollbackOptions) (RolledBack, error) {
	snap, err := st.Get(ctx, o.Ref)
	if errdefs.IsNotFound(err) {
		return RolledBack{}, fmt.Errorf("rollback of %s: no snapshot %q in the store at %s (`cube snapshots ls` lists them; another store: --store-root): %w",
			o.Container, o.Ref, st.Root(), err)
	}
	if err != nil {
		return RolledBack{}, fmt.Errorf("rollback of %s: %w", o.Container, err)
	}
	l, err := sh.List(ctx, &api.ListRequest{ContainerId: o.Container})
	if err != nil {
		return RolledBack{}, fmt.Errorf("rollback of %s: %w", o.Container, err)
	}
	if l.VmmPid == 0 {
		return RolledBack{}, fmt.Errorf("rollback of %s: its shim does not report the VMM's pid (a shim older than this cube): %w", o.Container, errdefs.ErrFailedPrecondition)
	}
	holder := Holder(o.Sandbox)
	before, err := heldBy(ctx, st, holder)
	if err != nil {
		return RolledBack{}, fmt.Errorf("rollback of %s: %w", o.Container, err)
	}
	// Ordering: the reference is taken before the VMM may map the
	// snapshot's files, so that a deletion is refused from that moment on;
	// a rollback that fails gives it back.
	if err := st.Acquire(ctx, snap.ID, store.Holder{Name: holder, PID: int(l.VmmPid)}); err != nil {
		return RolledBack{}, fmt.Errorf("rollback of %s: %w", o.Container, err)
	}
	resp, err := sh.Rollback(ctx, &api.RollbackRequest{ContainerId: o.Container, Dir: snap.Dir, Id: snap.ID})
	if err != nil {
		// Ordering: a refusal because the sandbox is busy (Unavailable)
		// keeps the reference: the rollback running meanwhile, from another
		// process, may be to this snapshot, and its reference is the same
		// file (one per holder); dropping it would let the snapshot be
		// deleted while its VM maps it. A kept one is dropped by the
		// sandbox's next rollback, or goes stale with its VMM.
		if !contains(before, snap.ID) && !errdefs.IsUnavailable(err) {
			if rerr := st.Release(context.WithoutCancel(ctx), snap.ID, holder); rerr != nil {
				err = errors.Join(err, fmt.Errorf("and releasing its reference failed (the store's next start drops it once the VM is gone): %w", rerr))
			}
		}
		return RolledBack{}, err // the shim's message names the container
	}
	out := RolledBack{Snapshot: snap, VM: resp}
	for _, id := range before {
		if id == snap.ID {
			continue
		}
		if err := st.Release(context.WithoutCancel(ctx), id, holder); err != nil && !errdefs.IsNotFound(err) {
			out.Warnings = append(out.Warnings, fmt.Sprintf("release %s's reference to snapshot %s: %v", holder, id, err))
			continue
		}
		out.Released = append(out.Released, id)
	}
	return out, nil
}

// heldBy lists the snapshots holder holds a live reference to.
func heldBy(ctx context.Context, st *store.Store, holder string) ([]string, error) {
	var ids []string
	token := ""
	for {
		page, next, err := st.List(ctx, store.ListOptions{Token: token, Limit: 1000})
		if err != nil {
			return nil, err
		}
		for _, s := range page {
			for _, r := range s.Holders {
				if r.Holder == holder && !r.Stale && r.Err == nil {
					ids = append(ids, s.ID)
				}
			}
		}
		if next == "" {
			return ids, nil
		}
		token = next
	}
}

func contains(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}
