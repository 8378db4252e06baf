package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/checkpoint/shimclient"
	api "github.com/cube-runtime/cube/shim/snapshotapi"
)

const psHelp = `Usage: cube ps CONTAINER [--json]

Lists the processes of the sandbox that runs CONTAINER as its guest holds
them (the guest agent's table): each container's init and execs, with the
guest pid, the status (created, running, stopped with its exit status) and
whether containerd knows the process. CONTAINER is an io.cube.v1 container
with a running task; in a pod, any of its containers (all are listed).

After 'cube rollback' the guest runs what it ran at the snapshot, also
processes containerd deleted since (an exec that ended and was removed):
they are listed with KNOWN "no". 'ctr task kill' cannot reach them;
'cube kill' can.

Flags:
  --json            print the list as JSON

` + globalHelp

const killHelp = `Usage: cube kill CONTAINER [--exec EXEC_ID | --all] [--signal SIG]

Sends a signal to a process of CONTAINER in its sandbox's guest: the
container's init, the exec EXEC_ID with --exec, or every process of the
container with --all. It reaches processes containerd no longer knows (a
process a rollback brought back after its exec was deleted: see 'cube ps'),
which 'ctr task kill' cannot.

Flags:
  --exec EXEC_ID    the exec to signal (default: the container's init)
  --all             every process of the container (not with --exec)
  --signal SIG, -s  a name (TERM, SIGKILL) or a number 1..64 (default TERM,
                    as 'ctr task kill')

` + globalHelp

// Process is one guest process as `cube ps --json` prints it.
type Process struct {
	Container string `json:"container"`
	// Exec is empty for a container's init.
	Exec       string     `json:"exec,omitempty"`
	PID        uint32     `json:"pid"`
	Status     string     `json:"status"`
	ExitStatus *uint32    `json:"exit_status,omitempty"`
	ExitedAt   *time.Time `json:"exited_at,omitempty"`
	// Known: containerd knows the process (its task or exec exists).
	Known bool `json:"known"`
}

// ps is `cube ps`.
func (r *runner) ps(ctx context.Context, args []string) int {
	const cmd = "cube ps"
	fs := r.flagSet(cmd)
	r.g.register(fs)
	asJSON := fs.Bool("json", false, "")
	pos, err := parse(fs, args)
	if err != nil {
		return r.parseFailed(cmd, psHelp, err)
	}
	if len(pos) != 1 {
		return r.usageError(cmd, fmt.Sprintf("want CONTAINER, got %d arguments", len(pos)))
	}
	var resp *api.ListProcessesResponse
	err = r.withShim(ctx, pos[0], func(_ shimclient.Containers, sh Shim) error {
		resp, err = sh.ListProcesses(ctx, &api.ListProcessesRequest{ContainerId: pos[0]})
		return err
	})
	if err != nil {
		return r.fail(cmd, err)
	}
	procs := processesOf(resp)
	if *asJSON {
		if err := writeJSON(r.env.Stdout, procs); err != nil {
			return r.fail(cmd, err)
		}
		return ExitOK
	}
	printProcesses(r.env.Stdout, procs)
	return ExitOK
}

// kill is `cube kill`.
func (r *runner) kill(ctx context.Context, args []string) int {
	const cmd = "cube kill"
	fs := r.flagSet(cmd)
	r.g.register(fs)
	exec := fs.String("exec", "", "")
	all := fs.Bool("all", false, "")
	sigName := fs.String("signal", "TERM", "")
	fs.StringVar(sigName, "s", "TERM", "")
	pos, err := parse(fs, args)
	if err != nil {
		return r.parseFailed(cmd, killHelp, err)
	}
	switch {
	case len(pos) != 1:
		return r.usageError(cmd, fmt.Sprintf("want CONTAINER, got %d arguments", len(pos)))
	case *all && *exec != "":
		return r.usageError(cmd, "--all signals every process of the container: give it without --exec")
	}
	sig, err := parseSignal(*sigName)
	if err != nil {
		return r.usageError(cmd, err.Error())
	}
	err = r.withShim(ctx, pos[0], func(_ shimclient.Containers, sh Shim) error {
		_, err := sh.Signal(ctx, &api.SignalRequest{ContainerId: pos[0], ExecId: *exec, Signal: sig, All: *all})
		return err
	})
	if err != nil {
		return r.fail(cmd, err)
	}
	return ExitOK
}

// withShim finds the shim of container id through containerd and calls f with containerd's containers and a
// connection to the shim.
func (r *runner) withShim(ctx context.Context, id string, f func(shimclient.Containers, Shim) error) error {
	cs, closer, err := r.env.Containers(ctx, r.g.address, r.g.namespace)
	if err != nil {
		return err
	}
	defer closer.Close()
	target, err := shimclient.Resolve(ctx, cs, r.locator(r.g.namespace), id)
	if err != nil {
		return err
	}
	sh, err := r.env.Dial(ctx, target.Address)
	if err != nil {
		return fmt.Errorf("%w (the shim of container %s is gone? `ctr -n %s task ls`)", err, id, r.g.namespace)
	}
	defer sh.Close()
	return f(cs, sh)
}

// parseSignal reads a signal as ctr does: a number, or a name with or without SIG.
func parseSignal(s string) (uint32, error) {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		if n < 1 || n > 64 {
			return 0, fmt.Errorf("--signal %s: want a signal number 1..64", s)
		}
		return uint32(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if n := unix.SignalNum(name); n != 0 {
		return uint32(n), nil
	}
	return 0, fmt.Errorf("--signal %q: not a signal (a name such as TERM, KILL, SIGUSR1, or a number 1..64)", s)
}

func processesOf(resp *api.ListProcessesResponse) []Process {
	out := []Process{}
	for _, p := range resp.GetProcesses() {
		pr := Process{Container: p.ContainerId, Exec: p.ExecId, PID: p.Pid, Status: p.Status, Known: p.Known}
		if p.Status == "stopped" {
			st := p.ExitStatus
			pr.ExitStatus = &st
			if p.ExitedAtUnixNano != 0 {
				at := time.Unix(0, p.ExitedAtUnixNano).UTC()
				pr.ExitedAt = &at
			}
		}
		out = append(out, pr)
	}
	return out
}

// printProcesses prints the list for a person.
func printProcesses(w io.Writer, procs []Process) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONTAINER\tEXEC\tPID\tSTATUS\tKNOWN")
	for _, p := range procs {
		exec, status, known := p.Exec, p.Status, "yes"
		if exec == "" {
			exec = "(init)"
		}
		if p.ExitStatus != nil {
			status = fmt.Sprintf("stopped (%d)", *p.ExitStatus)
		}
		if !p.Known {
			known = "no"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", p.Container, exec, p.PID, status, known)
	}
	tw.Flush()
}
