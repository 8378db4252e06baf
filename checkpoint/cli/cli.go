// Package cli is the `cube` command (cmd/cube only wires it): a containerd
// client with ctr's conventions (--address, --namespace and their
// environment variables) that takes whole-VM snapshots of io.cube.v1
// containers into the snapshot store and manages them. docs/cli.md is its
// user documentation; every command's --help says the same in short.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/containerd/containerd/v2/defaults"
	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/checkpoint/clone"
	"github.com/cube-runtime/cube/checkpoint/shimclient"
	"github.com/cube-runtime/cube/checkpoint/snapshots"
	"github.com/cube-runtime/cube/checkpoint/store"
	api "github.com/cube-runtime/cube/shim/snapshotapi"
)

// Exit statuses.
const (
	ExitOK      = 0
	ExitFailure = 1 // the command ran and failed (the message says why)
	ExitUsage   = 2 // bad arguments or flags
)

// Environment variables that set the global flags' defaults.
const (
	EnvAddress   = "CONTAINERD_ADDRESS"
	EnvNamespace = "CONTAINERD_NAMESPACE"
	EnvState     = "CUBE_CONTAINERD_STATE"
	EnvStoreRoot = "CUBE_STORE_ROOT"
)

// DefaultNamespace is ctr's default namespace.
const DefaultNamespace = "default"

// Shim is a connection to a shim's snapshot service.
type Shim interface {
	snapshots.Shim
	Rollback(ctx context.Context, req *api.RollbackRequest) (*api.RollbackResponse, error)
	Inspect(ctx context.Context, req *api.InspectRequest) (*api.InspectResponse, error)
	SetNetworkPolicy(ctx context.Context, req *api.SetNetworkPolicyRequest) (*api.NetworkPolicyResponse, error)
	GetNetworkPolicy(ctx context.Context, req *api.GetNetworkPolicyRequest) (*api.NetworkPolicyResponse, error)
	ListProcesses(ctx context.Context, req *api.ListProcessesRequest) (*api.ListProcessesResponse, error)
	Signal(ctx context.Context, req *api.SignalRequest) (*api.SignalResponse, error)
	Close() error
}

// Env is what Run takes from the process; tests replace the connections.
type Env struct {
	Stdout, Stderr io.Writer
	// Stdin is read by `cube internal oci-hook` (the OCI state).
	Stdin  io.Reader
	Getenv func(string) string
	// Containers connects to containerd at address for namespace ns.
	Containers func(ctx context.Context, address, ns string) (shimclient.Containers, io.Closer, error)
	// Dial connects to the shim at address.
	Dial func(ctx context.Context, address string) (Shim, error)
	// Maker connects to containerd at address for namespace ns to read and
	// make containers (restore, fork, the container record of a snapshot);
	// nil: those commands fail, and snapshots carry no record.
	Maker func(ctx context.Context, address, ns string) (clone.Maker, io.Closer, error)
}

// ProcessEnv is the real process's Env.
func ProcessEnv() Env {
	return Env{
		Stdout: os.Stdout, Stderr: os.Stderr, Stdin: os.Stdin, Getenv: os.Getenv,
		Containers: func(ctx context.Context, address, ns string) (shimclient.Containers, io.Closer, error) {
			c, err := shimclient.Connect(ctx, address, ns)
			if err != nil {
				return nil, nil, err
			}
			return c, c, nil
		},
		Dial: func(ctx context.Context, address string) (Shim, error) { return shimclient.Dial(ctx, address) },
		Maker: func(ctx context.Context, address, ns string) (clone.Maker, io.Closer, error) {
			c, err := shimclient.Connect(ctx, address, ns)
			if err != nil {
				return nil, nil, err
			}
			return &clone.Containerd{Client: c.Client, Namespace: ns}, c, nil
		},
	}
}

// globals are the flags every command takes (before or after its name).
type globals struct {
	address, namespace, state, storeRoot string
}

// defaults reads the environment's defaults of the global flags.
func (g *globals) defaults(getenv func(string) string) {
	pick := func(env, def string) string {
		if v := getenv(env); v != "" {
			return v
		}
		return def
	}
	g.address = pick(EnvAddress, defaults.DefaultAddress)
	g.namespace = pick(EnvNamespace, DefaultNamespace)
	g.state = pick(EnvState, shimclient.DefaultState)
	g.storeRoot = pick(EnvStoreRoot, store.DefaultRoot)
}

// register adds the global flags to fs, their defaults the values so far.
func (g *globals) register(fs *flag.FlagSet) {
	g.registerLong(fs)
	fs.StringVar(&g.namespace, "n", g.namespace, "containerd namespace (short)")
}

// registerLong adds the global flags without -n (which `cube fork` uses for
// the number of clones; --namespace, or -n before the command, still work).
func (g *globals) registerLong(fs *flag.FlagSet) {
	fs.StringVar(&g.address, "address", g.address, "containerd's socket")
	fs.StringVar(&g.namespace, "namespace", g.namespace, "containerd namespace")
	fs.StringVar(&g.state, "state", g.state, "containerd's state directory")
	fs.StringVar(&g.storeRoot, "store-root", g.storeRoot, "the snapshot store's root")
}

const globalHelp = `Global flags (before or after the command):
  --address PATH       containerd's socket (env CONTAINERD_ADDRESS; default /run/containerd/containerd.sock)
  --namespace NS, -n   containerd namespace (env CONTAINERD_NAMESPACE; default "default")
  --state DIR          containerd's state directory, where it records each shim's address
                       (env CUBE_CONTAINERD_STATE; default /run/containerd: containerd's "state" setting)
  --store-root DIR     the snapshot store (env CUBE_STORE_ROOT; default /var/lib/cube-snapshotter/vm-snapshots)
`

const usage = `Usage: cube [global flags] COMMAND [ARGS] [flags]

cube takes whole-VM snapshots of io.cube.v1 containers (memory, vCPUs,
devices and disks, captured in one short freeze while the processes keep
running) into Cube's snapshot store, where they outlive the container, and
manages them; it rolls a container back to one, restores one into a new
container, and forks a running container into new ones.

Commands:
  snapshot CONTAINER [--name N] [--incremental]
                           snapshot the VM that runs CONTAINER
  rollback CONTAINER SNAPSHOT
                           roll the VM that runs CONTAINER back to SNAPSHOT, in place
  restore SNAPSHOT NEW_ID  a new container NEW_ID running the VM of SNAPSHOT
  fork CONTAINER -n N [--all-or-nothing] [--prefix P]
                           N new containers, each running a copy of CONTAINER's VM
  snapshots ls [--sandbox S]
                           list the snapshots in the store
  snapshots inspect ID|NAME
                           show one snapshot as JSON
  snapshots rm ID|NAME...  delete snapshots
  ps CONTAINER [--json]    list the guest's processes of CONTAINER's sandbox, also
                           those containerd forgot (after a rollback)
  kill CONTAINER [--exec EXEC_ID | --all] [--signal SIG]
                           signal a process in the guest, also one containerd forgot
  network policy CONTAINER [--no-internet] [--allow-out CIDR] [--deny-out CIDR] [--reset]
                           show or replace the egress policy of CONTAINER's sandbox
  templates ls|rm [KEY...]  list or remove the shim's automatic templates
  internal oci-hook PHASE  the OCI hook that gives a sandbox Cube's default network
                           (run by runtimes, not people; see 'cube help internal')
  help [COMMAND]           a command's help

` + globalHelp + `
Run 'cube COMMAND --help' for a command. docs/cli.md has the details.
Exit status: 0 done, 1 the command failed (the message says why), 2 bad usage.
`

// Run runs cube with args (without the program name) and returns its exit
// status.
func Run(ctx context.Context, args []string, env Env) int {
	r := &runner{env: env}
	r.g.defaults(env.Getenv)
	fs := r.flagSet("cube")
	r.g.register(fs)
	if err := fs.Parse(args); err != nil {
		return r.parseFailed("cube", usage, err)
	}
	if fs.NArg() == 0 {
		fmt.Fprint(env.Stderr, usage)
		return ExitUsage
	}
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	switch cmd {
	case "snapshot":
		return r.snapshot(ctx, rest)
	case "snapshots":
		return r.snapshots(ctx, rest)
	case "rollback":
		return r.rollback(ctx, rest)
	case "restore":
		return r.restore(ctx, rest)
	case "fork":
		return r.fork(ctx, rest)
	case "ps":
		return r.ps(ctx, rest)
	case "kill":
		return r.kill(ctx, rest)
	case "network":
		return r.network(ctx, rest)
	case "templates":
		return r.templates(ctx, rest)
	case "internal":
		return r.internal(ctx, rest)
	case "help":
		return r.help(rest)
	}
	return r.usageError("cube", fmt.Sprintf("unknown command %q (commands: snapshot, rollback, restore, fork, snapshots, ps, kill, network, templates, help)", cmd))
}

// runner runs one cube command.
type runner struct {
	env Env
	g   globals
}

// flagSet is a FlagSet that prints nothing itself: parseFailed prints the
// help on --help, usageError the error otherwise.
func (r *runner) flagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parse parses args with fs, flags and arguments in any order ("--" ends
// the flags), and returns the arguments.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		// flag stops at "--" and drops it, or at the first argument.
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// parseFailed prints help for --help (-h), else reports the flag error.
func (r *runner) parseFailed(cmd, help string, err error) int {
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(r.env.Stdout, help)
		return ExitOK
	}
	return r.usageError(cmd, err.Error())
}

func (r *runner) usageError(cmd, msg string) int {
	fmt.Fprintf(r.env.Stderr, "%s: %s\nRun '%s --help' for usage.\n", cmd, msg, cmd)
	return ExitUsage
}

// fail reports a failed command.
func (r *runner) fail(cmd string, err error) int {
	fmt.Fprintf(r.env.Stderr, "%s: %v\n", cmd, err)
	return ExitFailure
}

func (r *runner) help(args []string) int {
	switch strings.Join(args, " ") {
	case "":
		fmt.Fprint(r.env.Stdout, usage)
	case "snapshot":
		fmt.Fprint(r.env.Stdout, snapshotHelp)
	case "snapshots":
		fmt.Fprint(r.env.Stdout, snapshotsHelp)
	case "rollback":
		fmt.Fprint(r.env.Stdout, rollbackHelp)
	case "restore":
		fmt.Fprint(r.env.Stdout, restoreHelp)
	case "fork":
		fmt.Fprint(r.env.Stdout, forkHelp)
	case "snapshots ls":
		fmt.Fprint(r.env.Stdout, lsHelp)
	case "snapshots inspect":
		fmt.Fprint(r.env.Stdout, inspectHelp)
	case "snapshots rm":
		fmt.Fprint(r.env.Stdout, rmHelp)
	case "ps":
		fmt.Fprint(r.env.Stdout, psHelp)
	case "kill":
		fmt.Fprint(r.env.Stdout, killHelp)
	case "network", "network policy":
		fmt.Fprint(r.env.Stdout, policyHelp)
	case "templates", "templates ls", "templates rm":
		fmt.Fprint(r.env.Stdout, templatesHelp)
	case "internal", "internal oci-hook":
		fmt.Fprint(r.env.Stdout, hookHelp)
	default:
		return r.usageError("cube help", fmt.Sprintf("no command %q", strings.Join(args, " ")))
	}
	return ExitOK
}

// openStore opens the store at --store-root. Its log (what Open collects
// after a crash, refusals) goes to stderr, warnings and worse only.
func (r *runner) openStore(ctx context.Context) (*store.Store, error) {
	log := logrus.New()
	log.SetOutput(r.env.Stderr)
	log.SetLevel(logrus.WarnLevel)
	st, err := store.Open(ctx, r.g.storeRoot, store.Options{Log: logrus.NewEntry(log)})
	if err != nil {
		return nil, fmt.Errorf("open the snapshot store at %s: %w (another root: --store-root DIR or %s)", r.g.storeRoot, err, EnvStoreRoot)
	}
	return st, nil
}

// maker connects to containerd to read and make containers.
func (r *runner) maker(ctx context.Context) (clone.Maker, io.Closer, error) {
	if r.env.Maker == nil {
		return nil, nil, fmt.Errorf("this cube cannot make containers (no containerd client)")
	}
	return r.env.Maker(ctx, r.g.address, r.g.namespace)
}

func (r *runner) locator(ns string) shimclient.Locator {
	return shimclient.Locator{State: r.g.state, Address: r.g.address, Namespace: ns}
}
