package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/cube-runtime/cube/checkpoint/shimclient"
	"github.com/cube-runtime/cube/checkpoint/snapshots"
)

const rollbackHelp = `Usage: cube rollback CONTAINER SNAPSHOT [--quiet | --json]

Rolls the VM that runs CONTAINER back in place to SNAPSHOT (an id or a name
in the snapshot store): guest memory, vCPU and device state and the writable
disks become the snapshot's. It is the same sandbox afterwards: the same
containerd container and task ids, the same VMM process. CONTAINER is an
io.cube.v1 container with a running task; in a pod, any of its containers
names the pod's one VM, and all of them roll back.

After the rollback the guest runs what it ran at the snapshot, and the shim's
view follows it: an exec started after the snapshot ends with status 137
(and an exit event); a process that exited after the snapshot runs again,
with its old pid and memory; running ones go on, their output re-attached.
The guest's clock is stepped to now and its RNG reseeded.

A rollback that cannot complete before the VM is touched (the snapshot is of
another kernel or VM shape, its files are damaged) leaves the sandbox as it
was. One snapshot or rollback at a time per sandbox: while one runs, another
is refused at once ("busy"). The sandbox holds the snapshot in the store
from then on: 'cube snapshots rm' refuses it until the container is gone or
rolled back to another snapshot.

Flags:
  --quiet, -q       print nothing but errors
  --json            print the shim's account as JSON

` + globalHelp + `
Prints how the memory came back (rewrite-dirty: only the pages written since
the snapshot, when it is the VM's parent; rewrite-diff: also the pages of the
memory layers the two do not share; rewrite-all: every page), how
long the vCPUs were stopped, the whole rollback's time, and each process's
fate (reattached, revived, ended, unchanged, unknown: a process the guest
runs that containerd deleted after the snapshot).
`

// rollback is `cube rollback`.
func (r *runner) rollback(ctx context.Context, args []string) int {
	const cmd = "cube rollback"
	fs := r.flagSet(cmd)
	r.g.register(fs)
	quiet := fs.Bool("quiet", false, "quiet")
	fs.BoolVar(quiet, "q", false, "quiet")
	asJSON := fs.Bool("json", false, "json")
	pos, err := parse(fs, args)
	if err != nil {
		return r.parseFailed(cmd, rollbackHelp, err)
	}
	switch {
	case len(pos) != 2:
		return r.usageError(cmd, fmt.Sprintf("want CONTAINER and SNAPSHOT, got %d arguments", len(pos)))
	case *quiet && *asJSON:
		return r.usageError(cmd, "--quiet and --json exclude each other")
	}
	rb, err := r.rollBack(ctx, pos[0], pos[1])
	if err != nil {
		return r.fail(cmd, err)
	}
	for _, w := range rb.Warnings {
		fmt.Fprintf(r.env.Stderr, "%s: warning: %s\n", cmd, w)
	}
	switch {
	case *quiet:
	case *asJSON:
		if err := writeJSON(r.env.Stdout, rb.VM); err != nil {
			return r.fail(cmd, err)
		}
	default:
		printRolledBack(r.env.Stdout, rb)
	}
	return ExitOK
}

// rollBack finds id's shim through containerd and rolls its VM back.
func (r *runner) rollBack(ctx context.Context, id, ref string) (snapshots.RolledBack, error) {
	cs, closer, err := r.env.Containers(ctx, r.g.address, r.g.namespace)
	if err != nil {
		return snapshots.RolledBack{}, err
	}
	defer closer.Close()
	target, err := shimclient.Resolve(ctx, cs, r.locator(r.g.namespace), id)
	if err != nil {
		return snapshots.RolledBack{}, err
	}
	st, err := r.openStore(ctx)
	if err != nil {
		return snapshots.RolledBack{}, err
	}
	sh, err := r.env.Dial(ctx, target.Address)
	if err != nil {
		return snapshots.RolledBack{}, fmt.Errorf("%w (the shim of container %s is gone? `ctr -n %s task ls`)", err, id, r.g.namespace)
	}
	defer sh.Close()
	return snapshots.Rollback(ctx, st, sh, snapshots.RollbackOptions{
		Container: id, Sandbox: snapshots.SandboxKey(r.g.namespace, target.Container.Group), Ref: ref,
	})
}

// printRolledBack prints `cube rollback`'s result for a person.
func printRolledBack(w io.Writer, rb snapshots.RolledBack) {
	s, vm := rb.Snapshot, rb.VM
	tw := tabwriter.NewWriter(w, 0, 8, 1, ' ', 0)
	row := func(k, format string, a ...any) { fmt.Fprintf(tw, "%s:\t"+format+"\n", append([]any{k}, a...)...) }
	row("snapshot", "%s (%s)", s.ID, orDash(strings.Join(s.Names, ", ")))
	row("sandbox", "%s (vmm pid %d)", s.Sandbox, vm.GetVmmPid())
	mem := vm.GetMemory()
	if strings.HasPrefix(mem, "rewrite-") {
		mem = fmt.Sprintf("%s (%d pages rewritten)", mem, vm.GetPagesRewritten())
	}
	row("memory", "%s", mem)
	if tm := vm.GetTimings(); tm != nil {
		row("frozen", "%.1f ms", tm.VmmFrozenMs)
		row("total", "%.1f ms (vmm %.1f ms, of it prepare %.1f ms; reconnect %.1f ms; reconcile %.1f ms)",
			tm.ShimTotalMs, tm.VmmTotalMs, tm.VmmPrepareMs, tm.ReconnectMs, tm.ReconcileMs)
	}
	for _, p := range vm.GetProcesses() {
		name := p.ContainerId
		if p.ExecId != "" {
			name += "/" + p.ExecId
		}
		row("process", "%s pid %d %s (%s)", name, p.Pid, p.Action, orDash(p.Status))
	}
	for _, w := range vm.GetWarnings() {
		row("warning", "%s", w)
	}
	if len(rb.Released) > 0 {
		row("released", "%s", strings.Join(rb.Released, ", "))
	}
	tw.Flush()
}
