package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/containerd/containerd/v2/pkg/identifiers"

	"github.com/cube-runtime/cube/checkpoint/clone"
	"github.com/cube-runtime/cube/checkpoint/shimclient"
	"github.com/cube-runtime/cube/checkpoint/snapshots"
)

const restoreHelp = `Usage: cube restore SNAPSHOT NEW_ID [--quiet | --json]

Makes a new io.cube.v1 container NEW_ID that runs the VM of SNAPSHOT (an id
or a name in the snapshot store), from where the snapshot left it: its
processes, their memory and pids, its disks. The container is made as the
snapshotted one was (its image, snapshotter, runtime and spec, recorded in
the snapshot by 'cube snapshot'; the image must be in this containerd,
unpacked for that snapshotter), with its own rootfs and cgroup; its task is
restored from the snapshot's directory in place: the VM maps the snapshot's
memory files (nothing is copied per restore) and its rootfs becomes a reflink
(or copy) of the snapshot's disk. The guest's clock is stepped and its RNG
reseeded. The task's stdio is discarded (the restored processes' output
has nowhere to go; use 'ctr task exec' to talk to them).

The new container holds the snapshot in the store while its VM runs: 'cube
snapshots rm' refuses it meanwhile. The snapshot's source container may be
gone; its VMM version, guest kernel and CPU must match this host's (a
refusal says which differs).

Flags:
  --quiet, -q       print nothing but errors
  --json            print the result as JSON

` + globalHelp

// restore is `cube restore`.
func (r *runner) restore(ctx context.Context, args []string) int {
	const cmd = "cube restore"
	fs := r.flagSet(cmd)
	r.g.register(fs)
	quiet := fs.Bool("quiet", false, "quiet")
	fs.BoolVar(quiet, "q", false, "quiet")
	asJSON := fs.Bool("json", false, "json")
	pos, err := parse(fs, args)
	if err != nil {
		return r.parseFailed(cmd, restoreHelp, err)
	}
	switch {
	case len(pos) != 2:
		return r.usageError(cmd, fmt.Sprintf("want SNAPSHOT and NEW_ID, got %d arguments", len(pos)))
	case *quiet && *asJSON:
		return r.usageError(cmd, "--quiet and --json exclude each other")
	}
	st, err := r.openStore(ctx)
	if err != nil {
		return r.fail(cmd, err)
	}
	m, closer, err := r.maker(ctx)
	if err != nil {
		return r.fail(cmd, err)
	}
	defer closer.Close()
	res, err := clone.Restore(ctx, st, m, r.g.namespace, pos[0], pos[1])
	if err != nil {
		return r.fail(cmd, err)
	}
	switch {
	case *quiet:
	case *asJSON:
		if err := writeJSON(r.env.Stdout, restoredJSON{ID: res.ID, Snapshot: res.Snapshot.ID, VMMPid: res.Pid, TookMS: ms(res.Took)}); err != nil {
			return r.fail(cmd, err)
		}
	default:
		tw := tabwriter.NewWriter(r.env.Stdout, 0, 8, 1, ' ', 0)
		fmt.Fprintf(tw, "container:\t%s (vmm pid %d)\n", res.ID, res.Pid)
		fmt.Fprintf(tw, "snapshot:\t%s (%s)\n", res.Snapshot.ID, res.Snapshot.Sandbox)
		fmt.Fprintf(tw, "took:\t%.1f ms\n", ms(res.Took))
		tw.Flush()
	}
	return ExitOK
}

type restoredJSON struct {
	ID       string  `json:"id"`
	Snapshot string  `json:"snapshot"`
	VMMPid   uint32  `json:"vmm_pid"`
	TookMS   float64 `json:"took_ms"`
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

const forkHelp = `Usage: cube fork CONTAINER -n N [--all-or-nothing] [--prefix P] [--json]

Makes N new io.cube.v1 containers, P-1 … P-N, each running a copy of the
VM of CONTAINER (a running io.cube.v1 container) as it is now: its
processes, their memory and pids, its disks. CONTAINER runs on untouched
(its VM is frozen only for the snapshot's short freeze window).

How: one snapshot of CONTAINER's VM into the store (temporary), then N
containers made as CONTAINER was (image, snapshotter, runtime, spec), each
with its own id, rootfs and cgroup, whose tasks restore that snapshot in
place: the VMs map the same memory files (shared through the page cache
until a clone writes a page) and each rootfs is a reflink of the snapshot's
disk. Each clone's clock is stepped and its RNG reseeded, so clones do not
share random numbers. The temporary snapshot is deleted before cube
returns (if cube dies first, the store's next start deletes it).

Flags:
  -n N               how many clones (1..100); here -n is not the namespace:
                     use --namespace NS (or 'cube -n NS fork …')
  --prefix P         the clones' ids are P-1 … P-N (default CONTAINER-fork-XXXXXX, random)
  --all-or-nothing   if a clone fails, stop and remove the clones made
  --json             print the result as JSON

` + globalHelp + `
Prints one line per clone (made, failed with the reason, or removed) and
exits 1 when any clone is missing.
`

// fork is `cube fork`.
func (r *runner) fork(ctx context.Context, args []string) int {
	const cmd = "cube fork"
	fs := r.flagSet(cmd)
	r.g.registerLong(fs)
	n := fs.Int("n", 0, "clones")
	prefix := fs.String("prefix", "", "prefix")
	all := fs.Bool("all-or-nothing", false, "all or nothing")
	asJSON := fs.Bool("json", false, "json")
	pos, err := parse(fs, args)
	if err != nil {
		return r.parseFailed(cmd, forkHelp, err)
	}
	switch {
	case len(pos) != 1:
		return r.usageError(cmd, fmt.Sprintf("want one CONTAINER, got %d arguments", len(pos)))
	case *n < 1 || *n > clone.MaxClones:
		return r.usageError(cmd, fmt.Sprintf("-n %d: want 1..%d clones", *n, clone.MaxClones))
	}
	if *prefix == "" {
		var b [3]byte
		if _, err := rand.Read(b[:]); err != nil {
			return r.fail(cmd, err)
		}
		*prefix = pos[0] + "-fork-" + hex.EncodeToString(b[:])
	} else if err := identifiers.Validate(fmt.Sprintf("%s-%d", *prefix, *n)); err != nil {
		// Refused before the temporary snapshot is taken (containerd
		// would refuse each clone).
		return r.usageError(cmd, fmt.Sprintf("--prefix %q: the clones' ids %s-1 … %s-%d must be valid container ids (letters and digits, single '.', '_' or '-' between them, at most 76 characters): %v",
			*prefix, *prefix, *prefix, *n, err))
	}
	forked, err := r.forkOf(ctx, pos[0], *n, *prefix, *all)
	for _, w := range forked.Warnings {
		fmt.Fprintf(r.env.Stderr, "%s: warning: %s\n", cmd, w)
	}
	if *asJSON && len(forked.Clones) > 0 {
		if jerr := writeJSON(r.env.Stdout, forkedJSONOf(forked)); jerr != nil {
			return r.fail(cmd, jerr)
		}
	} else if len(forked.Clones) > 0 {
		printForked(r.env.Stdout, forked)
	}
	if err != nil {
		return r.fail(cmd, err)
	}
	return ExitOK
}

func (r *runner) forkOf(ctx context.Context, id string, n int, prefix string, all bool) (clone.Forked, error) {
	cs, closer, err := r.env.Containers(ctx, r.g.address, r.g.namespace)
	if err != nil {
		return clone.Forked{}, err
	}
	defer closer.Close()
	target, err := shimclient.Resolve(ctx, cs, r.locator(r.g.namespace), id)
	if err != nil {
		return clone.Forked{}, err
	}
	st, err := r.openStore(ctx)
	if err != nil {
		return clone.Forked{}, err
	}
	m, mc, err := r.maker(ctx)
	if err != nil {
		return clone.Forked{}, err
	}
	defer mc.Close()
	// Clones a crashed fork left in this namespace go first.
	if got, err := clone.CollectAbandoned(ctx, m); err != nil {
		fmt.Fprintf(r.env.Stderr, "cube fork: %v\n", err)
	} else {
		for _, c := range got.Removed {
			fmt.Fprintf(r.env.Stderr, "cube fork: removed %s, a clone left by a fork that did not finish\n", c)
		}
		for c, err := range got.Failed {
			fmt.Fprintf(r.env.Stderr, "cube fork: %s, a clone left by a fork that did not finish, could not be removed: %v\n", c, err)
		}
	}
	sh, err := r.env.Dial(ctx, target.Address)
	if err != nil {
		return clone.Forked{}, fmt.Errorf("%w (the shim of container %s is gone? `ctr -n %s task ls`)", err, id, r.g.namespace)
	}
	defer sh.Close()
	return clone.Fork(ctx, st, sh, m, clone.ForkOptions{Container: id, Sandbox: snapshots.SandboxKey(r.g.namespace, target.Container.Group),
		N: n, Prefix: prefix, AllOrNothing: all})
}

type cloneJSON struct {
	ID      string  `json:"id"`
	VMMPid  uint32  `json:"vmm_pid,omitempty"`
	TookMS  float64 `json:"took_ms"`
	Error   string  `json:"error,omitempty"`
	Removed bool    `json:"removed,omitempty"`
}

type forkedJSON struct {
	Op             string      `json:"op"`
	Snapshot       string      `json:"snapshot"`
	SnapshotTookMS float64     `json:"snapshot_took_ms"`
	TookMS         float64     `json:"took_ms"`
	Clones         []cloneJSON `json:"clones"`
	Warnings       []string    `json:"warnings,omitempty"`
}

func forkedJSONOf(f clone.Forked) forkedJSON {
	out := forkedJSON{Op: f.Op, Snapshot: f.Snapshot, SnapshotTookMS: ms(f.SnapshotTook), TookMS: ms(f.Took), Warnings: f.Warnings}
	for _, c := range f.Clones {
		j := cloneJSON{ID: c.ID, VMMPid: c.Pid, TookMS: ms(c.Took), Removed: c.Removed}
		if c.Err != nil {
			j.Error = c.Err.Error()
		}
		out.Clones = append(out.Clones, j)
	}
	return out
}

func printForked(w io.Writer, f clone.Forked) {
	tw := tabwriter.NewWriter(w, 0, 8, 1, ' ', 0)
	fmt.Fprintf(tw, "snapshot:\t%s (temporary, %.1f ms)\n", f.Snapshot, ms(f.SnapshotTook))
	for _, c := range f.Clones {
		switch {
		case c.Err != nil:
			fmt.Fprintf(tw, "clone:\t%s failed: %v\n", c.ID, c.Err)
		case c.Removed:
			fmt.Fprintf(tw, "clone:\t%s removed (all or nothing)\n", c.ID)
		default:
			fmt.Fprintf(tw, "clone:\t%s vmm pid %d (%.1f ms)\n", c.ID, c.Pid, ms(c.Took))
		}
	}
	fmt.Fprintf(tw, "took:\t%.1f ms\n", ms(f.Took))
	tw.Flush()
}
