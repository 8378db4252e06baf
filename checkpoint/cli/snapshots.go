package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cube-runtime/cube/checkpoint/snapshots"
	"github.com/cube-runtime/cube/checkpoint/store"
	api "github.com/cube-runtime/cube/shim/snapshotapi"
)

const snapshotsHelp = `Usage: cube snapshots COMMAND

Manages the snapshots in the store (--store-root). They outlive the
containers they were taken of.

Commands:
  ls [--sandbox S] [--quiet]   list them, oldest first
  inspect ID|NAME              one snapshot as JSON
  rm ID|NAME...                delete snapshots

Run 'cube snapshots COMMAND --help' for a command.
`

const lsHelp = `Usage: cube snapshots ls [--sandbox S] [--quiet]

Lists the snapshots in the store, oldest first: id, names, sandbox
(NAMESPACE/SANDBOX), kind (full or incremental), parent, size on disk and
when it was taken. Snapshots of every namespace are listed unless --sandbox
picks one sandbox.

Flags:
  --sandbox S     only the snapshots of sandbox S: a container id for 'ctr run'
                  containers, the pod's sandbox id in Kubernetes; S is in
                  --namespace unless given as NAMESPACE/S
  --quiet, -q     print only the ids

` + globalHelp

const inspectHelp = `Usage: cube snapshots inspect ID|NAME

Prints one snapshot as JSON: id, names, sandbox, kind, parent, size,
creation time, directory, the VMs that hold it (holders) and, while its
sandbox's shim still runs and remembers it, the shim's figures ("vm": freeze
window, timings, bytes written).

` + globalHelp

const rmHelp = `Usage: cube snapshots rm ID|NAME...

Deletes snapshots from the store. A snapshot that a running VM holds, or that
another snapshot builds on (its parent), is refused, naming who holds it or
the children to delete first; the others are still deleted.

` + globalHelp

// snapshots is `cube snapshots COMMAND`.
func (r *runner) snapshots(ctx context.Context, args []string) int {
	const cmd = "cube snapshots"
	fs := r.flagSet(cmd)
	const help = snapshotsHelp
	r.g.register(fs)
	if err := fs.Parse(args); err != nil {
		return r.parseFailed(cmd, help, err)
	}
	if fs.NArg() == 0 {
		return r.usageError(cmd, "want a command: ls, inspect or rm")
	}
	rest := fs.Args()[1:]
	switch fs.Arg(0) {
	case "ls", "list":
		return r.ls(ctx, rest)
	case "inspect":
		return r.inspect(ctx, rest)
	case "rm", "remove", "delete":
		return r.rm(ctx, rest)
	}
	return r.usageError(cmd, fmt.Sprintf("unknown command %q (commands: ls, inspect, rm)", fs.Arg(0)))
}

func (r *runner) ls(ctx context.Context, args []string) int {
	const cmd = "cube snapshots ls"
	fs := r.flagSet(cmd)
	const help = lsHelp
	r.g.register(fs)
	sandbox := fs.String("sandbox", "", "sandbox")
	quiet := fs.Bool("quiet", false, "quiet")
	fs.BoolVar(quiet, "q", false, "quiet")
	pos, err := parse(fs, args)
	if err != nil {
		return r.parseFailed(cmd, help, err)
	}
	if len(pos) != 0 {
		return r.usageError(cmd, fmt.Sprintf("takes no arguments, got %q (a sandbox: --sandbox S)", pos))
	}
	opts := store.ListOptions{}
	if *sandbox != "" {
		opts.Sandbox = *sandbox
		if !strings.Contains(*sandbox, "/") {
			opts.Sandbox = snapshots.SandboxKey(r.g.namespace, *sandbox)
		}
	}
	st, err := r.openStore(ctx)
	if err != nil {
		return r.fail(cmd, err)
	}
	list, _, err := st.List(ctx, opts)
	if err != nil {
		return r.fail(cmd, err)
	}
	if *quiet {
		for _, s := range list {
			fmt.Fprintln(r.env.Stdout, s.ID)
		}
		return ExitOK
	}
	tw := tabwriter.NewWriter(r.env.Stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAMES\tSANDBOX\tKIND\tPARENT\tSIZE\tCREATED")
	for _, s := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, orDash(strings.Join(s.Names, ",")), s.Sandbox, s.Kind,
			orDash(s.Parent), bytesHuman(s.Size), s.Created.Local().Format(time.RFC3339))
	}
	tw.Flush()
	return ExitOK
}

func (r *runner) inspect(ctx context.Context, args []string) int {
	const cmd = "cube snapshots inspect"
	fs := r.flagSet(cmd)
	const help = inspectHelp
	r.g.register(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return r.parseFailed(cmd, help, err)
	}
	if len(pos) != 1 {
		return r.usageError(cmd, fmt.Sprintf("want one ID or NAME, got %d arguments", len(pos)))
	}
	st, err := r.openStore(ctx)
	if err != nil {
		return r.fail(cmd, err)
	}
	s, err := st.Get(ctx, pos[0])
	if err != nil {
		return r.fail(cmd, fmt.Errorf("%w ('cube snapshots ls' lists the snapshots in %s)", err, st.Root()))
	}
	if err := writeJSON(r.env.Stdout, describe(s, r.shimRecord(ctx, s))); err != nil {
		return r.fail(cmd, err)
	}
	return ExitOK
}

// shimRecord asks the shim of s's sandbox, if it still runs, for its record
// of s: best effort, nil when there is none.
func (r *runner) shimRecord(ctx context.Context, s store.Snapshot) *api.Snapshot {
	ns, group, ok := strings.Cut(s.Sandbox, "/")
	if !ok {
		return nil
	}
	addr, err := r.locator(ns).Find(group, group)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	sh, err := r.env.Dial(ctx, addr)
	if err != nil {
		return nil
	}
	defer sh.Close()
	resp, err := sh.Inspect(ctx, &api.InspectRequest{ContainerId: group, Ref: s.ID})
	if err != nil || resp.Snapshot.GetDir() != s.Dir {
		return nil
	}
	return resp.Snapshot
}

func (r *runner) rm(ctx context.Context, args []string) int {
	const cmd = "cube snapshots rm"
	fs := r.flagSet(cmd)
	const help = rmHelp
	r.g.register(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return r.parseFailed(cmd, help, err)
	}
	if len(pos) == 0 {
		return r.usageError(cmd, "want at least one ID or NAME")
	}
	st, err := r.openStore(ctx)
	if err != nil {
		return r.fail(cmd, err)
	}
	var errs []error
	for _, ref := range pos {
		s, err := st.Get(ctx, ref)
		id := ref
		if err == nil {
			id = s.ID
		}
		if err := st.Delete(ctx, ref); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ref, err))
			continue
		}
		fmt.Fprintln(r.env.Stdout, id)
	}
	if len(errs) > 0 {
		return r.fail(cmd, errors.Join(errs...))
	}
	return ExitOK
}
