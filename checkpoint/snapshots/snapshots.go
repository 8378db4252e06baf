// Package snapshots takes a sandbox's VM snapshot into the snapshot store
// through the shim's snapshot service: the caller of the shim owns the store
// (checkpoint/ is the layer above the shim). Take reserves the snapshot in the
// store (Begin: an id, the names, the directory), has the shim's VMM write the
// VM snapshot into that directory, and commits it; on any failure it aborts,
// so nothing of the attempt stays in the store. The cube CLI and the HTTP
// facade share it.
package snapshots

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/checkpoint/store"
	api "github.com/cube-runtime/cube/shim/snapshotapi"
)

// Shim is the part of the shim's snapshot service Take uses
// (checkpoint/shimclient.Client; a fake in tests).
type Shim interface {
	Snapshot(ctx context.Context, req *api.SnapshotRequest) (*api.SnapshotResponse, error)
	List(ctx context.Context, req *api.ListRequest) (*api.ListResponse, error)
}

// SandboxKey is how the store names a sandbox: containerd's namespace and
// the sandbox group ("default/c1"), so that sandboxes of two namespaces with
// one id stay apart. containerd's ids and namespaces hold no "/".
func SandboxKey(namespace, group string) string { return namespace + "/" + group }

// Options say what to take.
type Options struct {
	// Container is any container of the sandbox (the shim snapshots its VM).
	Container string
	// Sandbox is the store's name of the sandbox (SandboxKey).
	Sandbox string
	// Names are given to the snapshot (reserved before the VM is touched).
	Names []string
	// Incremental writes only the memory dirtied since the VM's last snapshot,
	// which must be in this store.
	Incremental bool
	// Op tags the snapshot with an operation (a fork's temporary snapshot):
	// the store deletes it if this process dies before KeepOp or DropOp.
	Op string
	// Before, when set, runs once the VM snapshot is written into dir and
	// before the store commits it (a caller adds its own files, e.g. the
	// container record of checkpoint/clone); its error aborts the snapshot.
	Before func(dir string) error
}

// Taken is a snapshot in the store and the shim's figures of it.
type Taken struct {
	Snapshot store.Snapshot
	VM       *api.Snapshot
}

// Take takes a snapshot of the sandbox of o.Container into st through sh.
func Take(ctx context.Context, st *store.Store, sh Shim, o Options) (t Taken, err error) {
	parent := ""
	if o.Incremental {
		if parent, err = base(ctx, st, sh, o.Container); err != nil {
			return Taken{}, err
		}
	}
	p, err := st.Begin(ctx, store.BeginOptions{Sandbox: o.Sandbox, Parent: parent, Names: o.Names, Op: o.Op})
	if err != nil {
		return Taken{}, fmt.Errorf("snapshot of %s: %w", o.Container, err)
	}
	committed := false
	defer func() {
		if committed {
			return
		}
		// Ordering: once the shim's call has returned (the VMM wrote or gave
		// up); ctx may be done, the cleanup is not.
		if aerr := p.Abort(context.WithoutCancel(ctx)); aerr != nil {
			err = errors.Join(err, fmt.Errorf("and removing what it left in the store failed (the store's next start collects it): %w", aerr))
		}
	}()
	resp, err := sh.Snapshot(ctx, &api.SnapshotRequest{ContainerId: o.Container, Dir: p.Dir(), Incremental: o.Incremental,
		Id: p.ID(), Names: o.Names})
	if err != nil {
		return Taken{}, err // the shim's message names the container
	}
	if o.Before != nil {
		if err := o.Before(p.Dir()); err != nil {
			return Taken{}, fmt.Errorf("snapshot of %s: %w", o.Container, err)
		}
	}
	snap, err := p.Commit(ctx)
	if err != nil {
		return Taken{}, fmt.Errorf("snapshot of %s: the VM snapshot was written but the store refused it: %w", o.Container, err)
	}
	committed = true
	return Taken{Snapshot: snap, VM: resp.Snapshot}, nil
}

// base returns the store id of the VM's last snapshot, the parent of an
// incremental one: refused, before anything is reserved or frozen, when
// there is none, or when it is not a snapshot of st.
func base(ctx context.Context, st *store.Store, sh Shim, container string) (string, error) {
	l, err := sh.List(ctx, &api.ListRequest{ContainerId: container})
	if err != nil {
		return "", fmt.Errorf("incremental snapshot of %s: %w", container, err)
	}
	var b *api.Snapshot
	for _, s := range l.Snapshots {
		if s.Base {
			b = s
		}
	}
	if b == nil || b.Id == "" {
		return "", fmt.Errorf("incremental snapshot of %s: its VM has no earlier snapshot in a store to build on (none since it started, the last one failed, or it was `ctr task checkpoint`): take a full snapshot first (without --incremental): %w",
			container, errdefs.ErrFailedPrecondition)
	}
	s, err := st.Get(ctx, b.Id)
	if errdefs.IsNotFound(err) {
		return "", fmt.Errorf("incremental snapshot of %s: its VM's last snapshot %s (%s) is not in the store at %s (deleted, or taken into another store): take a full snapshot first: %w",
			container, b.Id, b.Dir, st.Root(), errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return "", fmt.Errorf("incremental snapshot of %s: its parent: %w", container, err)
	}
	return s.ID, nil
}
