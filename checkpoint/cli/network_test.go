package cli

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/cube-runtime/cube/shim/egress"
	"github.com/cube-runtime/cube/shim/sandbox"
)

// policyNet is a sandbox network that keeps its egress policy in memory.
type policyNet struct {
	mu sync.Mutex
	p  egress.Policy
}

func (n *policyNet) Attach(ctx context.Context) (sandbox.NetworkAttachment, error) {
	r, w, _ := os.Pipe()
	w.Close()
	return sandbox.NetworkAttachment{NICs: []sandbox.NIC{{Tap: r, MAC: "02:42:0a:58:00:05"}}}, nil
}
func (n *policyNet) Detach(ctx context.Context) error { return nil }
func (n *policyNet) SetEgressPolicy(ctx context.Context, p egress.Policy) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.p = p
	return nil
}
func (n *policyNet) EgressStatus(ctx context.Context) (egress.Status, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := egress.Status{Policy: n.p, Device: "vethc1"}
	if !n.p.AllowInternet {
		st.Counters = []egress.Counter{{Action: egress.ActionNoInternet, CIDR: "0.0.0.0/0", Packets: 4, Bytes: 240}}
	}
	return st, nil
}

func TestNetworkPolicyCommand(t *testing.T) {
	n := &policyNet{p: egress.Open()}
	w := newNetWorld(t, n)
	out, _ := w.cube(t, ExitOK, "network", "policy", "c1")
	if !strings.Contains(out, "internet   allowed") || !strings.Contains(out, "device     vethc1") {
		t.Errorf("show:\n%s", out)
	}
	out, _ = w.cube(t, ExitOK, "network", "policy", "c1", "--no-internet", "--allow-out", "10.88.0.1,10.1.0.0/16", "--allow-out", "192.0.2.1",
		"--deny-out", "10.1.2.0/24")
	if n.p.AllowInternet || len(n.p.AllowOut) != 3 || len(n.p.DenyOut) != 1 {
		t.Errorf("policy set: %v", n.p)
	}
	for _, want := range []string{"internet   denied", "allow out  10.88.0.1/32, 10.1.0.0/16, 192.0.2.1/32", "deny out   10.1.2.0/24",
		"no-internet  0.0.0.0/0    4        240"} {
		if !strings.Contains(out, want) {
			t.Errorf("set: no %q in:\n%s", want, out)
		}
	}
	out, _ = w.cube(t, ExitOK, "network", "policy", "c1", "--json")
	var np NetworkPolicy
	if err := json.Unmarshal([]byte(out), &np); err != nil || np.AllowInternetAccess || len(np.AllowOut) != 3 || np.Sandbox != "c1" ||
		len(np.Counters) != 1 || np.Counters[0].Packets != 4 {
		t.Errorf("--json: %+v %v\n%s", np, err, out)
	}

	// A bad CIDR: the shim names the field; the policy stays.
	_, errOut := w.cube(t, ExitFailure, "network", "policy", "c1", "--deny-out", "10.0.0.0/8,300.1.1.1")
	if !strings.Contains(errOut, "deny_out[1]") || !strings.Contains(errOut, "300.1.1.1") || n.p.AllowInternet {
		t.Errorf("bad CIDR: %s (policy now %v)", errOut, n.p)
	}
	w.cube(t, ExitOK, "network", "policy", "c1", "--reset")
	if !n.p.IsOpen() || len(n.p.AllowOut) != 0 {
		t.Errorf("after --reset: %v", n.p)
	}
	w.cube(t, ExitUsage, "network", "policy", "c1", "--reset", "--no-internet")
	w.cube(t, ExitUsage, "network", "policy")
	w.cube(t, ExitUsage, "network")
	if out, _ := w.cube(t, ExitOK, "network", "policy", "--help"); !strings.Contains(out, "first match wins") {
		t.Errorf("help: %s", out)
	}
}

func TestNetworkPolicyHostNetworkSandbox(t *testing.T) {
	w := newWorld(t)
	_, errOut := w.cube(t, ExitFailure, "network", "policy", "c1", "--no-internet")
	if !strings.Contains(errOut, "no network of its own") {
		t.Errorf("host-network sandbox: %s", errOut)
	}
}
