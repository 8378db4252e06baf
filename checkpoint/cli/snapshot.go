package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/cube-runtime/cube/checkpoint/clone"
	"github.com/cube-runtime/cube/checkpoint/shimclient"
	"github.com/cube-runtime/cube/checkpoint/snapshots"
)

const snapshotHelp = `Usage: cube snapshot CONTAINER [--name NAME]... [--incremental] [--quiet | --json]

Snapshots the whole VM that runs CONTAINER into the snapshot store: guest
memory, vCPU and device state, and a copy of every writable disk (a reflink
where the store shares a filesystem with the container images). CONTAINER is
an io.cube.v1 container with a running or paused task; in a pod, any of its
containers names the pod's one VM.

A running guest syncs its filesystems first; the vCPUs stop only while the
VM's state and the memory written since the pre-copy are saved, and then run
on: the container keeps running. One snapshot at a time per sandbox: while
one is taken, another is refused at once ("busy"), never queued.

Flags:
  --name NAME       name the snapshot (unique in the store; repeat for several names)
  --incremental     write only the memory pages dirtied since the VM's last snapshot,
                    which must be in this store (its parent)
  --quiet, -q       print only the snapshot's id
  --json            print the snapshot as JSON (as 'cube snapshots inspect' does)

` + globalHelp + `
Prints the snapshot's id, names, sandbox, kind, parent and size on disk, how
long the VM was frozen and the snapshot took, and the bytes written.
`

// names collects repeated --name flags.
type names []string

func (n *names) String() string     { return strings.Join(*n, ",") }
func (n *names) Set(v string) error { *n = append(*n, v); return nil }

// snapshot is `cube snapshot`.
func (r *runner) snapshot(ctx context.Context, args []string) int {
	const cmd = "cube snapshot"
	fs := r.flagSet(cmd)
	const help = snapshotHelp
	r.g.register(fs)
	var ns names
	fs.Var(&ns, "name", "name")
	incremental := fs.Bool("incremental", false, "incremental")
	quiet := fs.Bool("quiet", false, "quiet")
	fs.BoolVar(quiet, "q", false, "quiet")
	asJSON := fs.Bool("json", false, "json")
	pos, err := parse(fs, args)
	if err != nil {
		return r.parseFailed(cmd, help, err)
	}
	switch {
	case len(pos) != 1:
		return r.usageError(cmd, fmt.Sprintf("want one CONTAINER, got %d arguments", len(pos)))
	case *quiet && *asJSON:
		return r.usageError(cmd, "--quiet and --json exclude each other")
	}
	taken, err := r.take(ctx, pos[0], ns, *incremental)
	if err != nil {
		return r.fail(cmd, err)
	}
	out := r.env.Stdout
	switch {
	case *quiet:
		fmt.Fprintln(out, taken.Snapshot.ID)
	case *asJSON:
		if err := writeJSON(out, describe(taken.Snapshot, taken.VM)); err != nil {
			return r.fail(cmd, err)
		}
	default:
		printTaken(out, taken)
	}
	return ExitOK
}

// take finds id's shim through containerd and takes the snapshot.
func (r *runner) take(ctx context.Context, id string, ns names, incremental bool) (snapshots.Taken, error) {
	cs, closer, err := r.env.Containers(ctx, r.g.address, r.g.namespace)
	if err != nil {
		return snapshots.Taken{}, err
	}
	defer closer.Close()
	target, err := shimclient.Resolve(ctx, cs, r.locator(r.g.namespace), id)
	if err != nil {
		return snapshots.Taken{}, err
	}
	st, err := r.openStore(ctx)
	if err != nil {
		return snapshots.Taken{}, err
	}
	sh, err := r.env.Dial(ctx, target.Address)
	if err != nil {
		return snapshots.Taken{}, fmt.Errorf("%w (the shim of container %s is gone? `ctr -n %s task ls`)", err, id, r.g.namespace)
	}
	defer sh.Close()
	o := snapshots.Options{
		Container: id, Sandbox: snapshots.SandboxKey(r.g.namespace, target.Container.Group),
		Names: ns, Incremental: incremental,
	}
	// The container record (image, snapshotter, runtime, spec) goes into the
	// snapshot: `cube restore` makes the new container from it.
	if r.env.Maker != nil {
		m, mc, err := r.env.Maker(ctx, r.g.address, r.g.namespace)
		if err != nil {
			return snapshots.Taken{}, err
		}
		defer mc.Close()
		rec, err := m.Record(ctx, id)
		if err != nil {
			return snapshots.Taken{}, fmt.Errorf("snapshot of %s: %w", id, err)
		}
		o.Before = func(dir string) error { return clone.WriteRecord(dir, rec) }
	}
	return snapshots.Take(ctx, st, sh, o)
}
