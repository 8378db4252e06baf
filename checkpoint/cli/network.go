package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/cube-runtime/cube/checkpoint/shimclient"
	api "github.com/cube-runtime/cube/shim/snapshotapi"
)

const policyHelp = `Usage: cube network policy CONTAINER [--no-internet] [--allow-out CIDR]... [--deny-out CIDR]... [--reset] [--json]

Shows, or with any of --no-internet, --allow-out, --deny-out, --reset
replaces, the egress policy of the sandbox that runs CONTAINER (an
io.cube.v1 container with a running task; in a pod, any of its containers).
The policy is enforced on the host, where the guest cannot touch it: an
nftables table on the host's end of the sandbox's link. It applies at once
to the running sandbox and goes with it.

For every IPv4 or IPv6 packet the sandbox sends, the first match wins:
  1. its destination is in an --allow-out CIDR: sent;
  2. its destination is in a --deny-out CIDR: dropped;
  3. with --no-internet: dropped.
With any restriction, frames that are neither ARP, IPv4 nor IPv6 are dropped.
Dropped packets are counted per rule (shown below the policy). The filter is
stateless: with --no-internet, a server in the sandbox answers only clients
an --allow-out CIDR names.

A new policy replaces the old one whole (say every list again); --reset
alone allows everything. Only sandboxes with a network of their own (a CRI
pod with CNI networking, a cube-api sandbox, a container whose spec has
network hooks) have a policy: a host-network sandbox is refused.

Flags:
  --no-internet       drop what --allow-out does not name
  --allow-out CIDR    allow this destination (repeat, or comma-separate; an
                      address is a /32 or /128)
  --deny-out CIDR     drop this destination (repeat, or comma-separate)
  --reset             no restriction (with none of the above)
  --json              print the policy and counters as JSON

` + globalHelp

// cidrList is a repeatable flag of comma-separated CIDRs.
type cidrList []string

func (l *cidrList) String() string { return strings.Join(*l, ",") }
func (l *cidrList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// NetworkPolicy is a sandbox's egress policy as `cube network policy --json` prints it.
type NetworkPolicy struct {
	Sandbox             string        `json:"sandbox"`
	Device              string        `json:"device"`
	AllowInternetAccess bool          `json:"allow_internet_access"`
	AllowOut            []string      `json:"allow_out"`
	DenyOut             []string      `json:"deny_out"`
	Counters            []RuleCounter `json:"counters"`
}

// RuleCounter is one rule's count since the policy was set.
type RuleCounter struct {
	Action  string `json:"action"`
	CIDR    string `json:"cidr,omitempty"`
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// network is `cube network`.
func (r *runner) network(ctx context.Context, args []string) int {
	if len(args) == 0 || args[0] != "policy" {
		if len(args) > 0 && (args[0] == "--help" || args[0] == "-h") {
			fmt.Fprint(r.env.Stdout, policyHelp)
			return ExitOK
		}
		return r.usageError("cube network", "want a subcommand: policy")
	}
	const cmd = "cube network policy"
	fs := r.flagSet(cmd)
	r.g.register(fs)
	noInternet := fs.Bool("no-internet", false, "")
	reset := fs.Bool("reset", false, "")
	asJSON := fs.Bool("json", false, "")
	var allow, deny cidrList
	fs.Var(&allow, "allow-out", "")
	fs.Var(&deny, "deny-out", "")
	pos, err := parse(fs, args[1:])
	if err != nil {
		return r.parseFailed(cmd, policyHelp, err)
	}
	set := false
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "no-internet", "allow-out", "deny-out", "reset":
			set = true
		}
	})
	switch {
	case len(pos) != 1:
		return r.usageError(cmd, fmt.Sprintf("want CONTAINER, got %d arguments", len(pos)))
	case *reset && (*noInternet || len(allow) > 0 || len(deny) > 0):
		return r.usageError(cmd, "--reset excludes --no-internet, --allow-out and --deny-out")
	}
	var req *api.NetworkPolicy
	if set {
		internet := !*noInternet
		req = &api.NetworkPolicy{AllowInternetAccess: &internet, AllowOut: allow, DenyOut: deny}
	}
	resp, err := r.networkPolicy(ctx, pos[0], set, req)
	if err != nil {
		return r.fail(cmd, err)
	}
	np := networkPolicyOf(resp)
	if *asJSON {
		if err := writeJSON(r.env.Stdout, np); err != nil {
			return r.fail(cmd, err)
		}
		return ExitOK
	}
	printNetworkPolicy(r.env.Stdout, np)
	return ExitOK
}

// networkPolicy finds id's shim through containerd and sets (set) or gets its sandbox's policy.
func (r *runner) networkPolicy(ctx context.Context, id string, set bool, p *api.NetworkPolicy) (*api.NetworkPolicyResponse, error) {
	var resp *api.NetworkPolicyResponse
	err := r.withShim(ctx, id, func(cs shimclient.Containers, sh Shim) error {
		var err error
		if !set {
			resp, err = sh.GetNetworkPolicy(ctx, &api.GetNetworkPolicyRequest{ContainerId: id})
			return err
		}
		if resp, err = sh.SetNetworkPolicy(ctx, &api.SetNetworkPolicyRequest{ContainerId: id, Policy: p}); err != nil {
			return err
		}
		// Ordering: recorded in the container's spec once in force, so a
		// fork or restore of it starts with this policy.
		if pr, ok := cs.(shimclient.PolicyRecorder); ok {
			if err := pr.RecordPolicy(ctx, id, resp.GetPolicy()); err != nil {
				return fmt.Errorf("the new egress policy is in force, but: %w (set it again)", err)
			}
		}
		return nil
	})
	return resp, err
}

func networkPolicyOf(r *api.NetworkPolicyResponse) NetworkPolicy {
	np := NetworkPolicy{Sandbox: r.SandboxId, Device: r.Device, AllowInternetAccess: true, AllowOut: []string{}, DenyOut: []string{},
		Counters: []RuleCounter{}}
	if p := r.Policy; p != nil {
		np.AllowInternetAccess = p.AllowInternetAccess == nil || *p.AllowInternetAccess
		np.AllowOut = append(np.AllowOut, p.AllowOut...)
		np.DenyOut = append(np.DenyOut, p.DenyOut...)
	}
	for _, c := range r.Counters {
		np.Counters = append(np.Counters, RuleCounter{Action: c.Action, CIDR: c.Cidr, Packets: c.Packets, Bytes: c.Bytes})
	}
	return np
}

// printNetworkPolicy prints a policy for a person.
func printNetworkPolicy(w io.Writer, np NetworkPolicy) {
	list := func(l []string) string {
		if len(l) == 0 {
			return "-"
		}
		return strings.Join(l, ", ")
	}
	internet := "allowed"
	if !np.AllowInternetAccess {
		internet = "denied"
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "sandbox\t%s\n", np.Sandbox)
	fmt.Fprintf(tw, "device\t%s\n", np.Device)
	fmt.Fprintf(tw, "internet\t%s\n", internet)
	fmt.Fprintf(tw, "allow out\t%s\n", list(np.AllowOut))
	fmt.Fprintf(tw, "deny out\t%s\n", list(np.DenyOut))
	tw.Flush()
	if len(np.Counters) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RULE\tDESTINATION\tPACKETS\tBYTES")
	for _, c := range np.Counters {
		dst := c.CIDR
		if dst == "" {
			dst = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\n", c.Action, dst, c.Packets, c.Bytes)
	}
	tw.Flush()
}
