package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/cube-runtime/cube/checkpoint/sandboxnet"
)

const hookHelp = `Usage: cube internal oci-hook [--network N] [--cni-conf-dir DIR] [--cni-bin-dir DIRS] [--cni-cache-dir DIR] PHASE

An OCI hook, not a command for people: cube-api puts it in the spec of each
sandbox it makes (and anyone may put it in an io.cube.v1 container's spec)
to give the sandbox Cube's default network, as nerdctl's own oci-hook does
for runc. The runtime runs it on the host with the OCI state on stdin; the
Cube shim does so against a network namespace it holds for the VM.

PHASE is createRuntime (or prestart): CNI ADD of the network in the state's
pid's network namespace, with the ports of the io.cube.network.ports
annotation (HOSTPORT:SANDBOXPORT[/tcp|/udp], comma-separated) mapped from
the host; CNI's result is printed as JSON. Or poststop: CNI DEL (the address
released, the ports unmapped).

Flags:
  --network N          the CNI network list's name (default "cube": a bridge cube0 with NAT on
                       10.98.0.0/16 and portmap, written to the conf dir when missing)
  --cni-conf-dir DIR   where <N>.conflist is (default /etc/cube/cni)
  --cni-bin-dir DIRS   ':'-separated CNI plugin directories (default /usr/lib/cni:/opt/cni/bin)
  --cni-cache-dir DIR  CNI's cache and the default network's address leases (default /var/lib/cube/cni)
  --timeout D          bound on the CNI call (default 1m)
`

// internal runs `cube internal ...`: commands other programs run.
func (r *runner) internal(ctx context.Context, args []string) int {
	if len(args) == 0 || args[0] != "oci-hook" {
		if len(args) > 0 && (args[0] == "--help" || args[0] == "-h") {
			fmt.Fprint(r.env.Stdout, hookHelp)
			return ExitOK
		}
		return r.usageError("cube internal", "want: cube internal oci-hook PHASE")
	}
	return r.ociHook(ctx, args[1:])
}

func (r *runner) ociHook(ctx context.Context, args []string) int {
	const cmd = "cube internal oci-hook"
	c := sandboxnet.DefaultConfig()
	bins := strings.Join(c.BinDirs, ":")
	fs := r.flagSet(cmd)
	fs.StringVar(&c.Network, "network", c.Network, "")
	fs.StringVar(&c.ConfDir, "cni-conf-dir", c.ConfDir, "")
	fs.StringVar(&bins, "cni-bin-dir", bins, "")
	fs.StringVar(&c.CacheDir, "cni-cache-dir", c.CacheDir, "")
	timeout := fs.Duration("timeout", time.Minute, "")
	pos, err := parse(fs, args)
	if err != nil {
		return r.parseFailed(cmd, hookHelp, err)
	}
	if len(pos) != 1 {
		return r.usageError(cmd, "want one PHASE: createRuntime, prestart or poststop")
	}
	c.BinDirs = strings.Split(bins, ":")
	if r.env.Stdin == nil {
		return r.fail(cmd, fmt.Errorf("no stdin to read the OCI state from"))
	}
	st, err := sandboxnet.ReadState(r.env.Stdin)
	if err != nil {
		return r.fail(cmd, err)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	switch pos[0] {
	case "createRuntime", "prestart":
		if err := sandboxnet.EnsureConflist(c); err != nil {
			return r.fail(cmd, err)
		}
		res, err := sandboxnet.Add(ctx, c, st)
		if err != nil {
			return r.fail(cmd, err)
		}
		b, _ := json.Marshal(res)
		fmt.Fprintf(r.env.Stdout, "%s\n", b)
	case "poststop":
		if err := sandboxnet.Del(ctx, c, st); err != nil {
			return r.fail(cmd, err)
		}
	default:
		return r.usageError(cmd, fmt.Sprintf("phase %q: want createRuntime, prestart or poststop", pos[0]))
	}
	return ExitOK
}
