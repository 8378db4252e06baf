package snapshotsvc

import (
	"context"
	"os"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/cube-runtime/cube/shim/egress"
	"github.com/cube-runtime/cube/shim/sandbox"
	api "github.com/cube-runtime/cube/shim/snapshotapi"
)

// egressNet is a sandbox network that takes egress policies (in memory).
type egressNet struct {
	mu     sync.Mutex
	policy egress.Policy
	sets   int
}

func (n *egressNet) Attach(ctx context.Context) (sandbox.NetworkAttachment, error) {
	r, w, _ := os.Pipe()
	w.Close()
	return sandbox.NetworkAttachment{NICs: []sandbox.NIC{{Tap: r, MAC: "02:42:0a:58:00:05"}}}, nil
}
func (n *egressNet) Detach(ctx context.Context) error { return nil }
func (n *egressNet) SetEgressPolicy(ctx context.Context, p egress.Policy) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.policy, n.sets = p, n.sets+1
	return nil
}
func (n *egressNet) EgressStatus(ctx context.Context) (egress.Status, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := egress.Status{Policy: n.policy, Device: "veth1234"}
	if !n.policy.IsOpen() {
		st.Counters = []egress.Counter{{Action: egress.ActionNoInternet, CIDR: "0.0.0.0/0", Packets: 2, Bytes: 120}}
	}
	return st, nil
}

func TestNetworkPolicy(t *testing.T) {
	n := &egressNet{policy: egress.Open()}
	h := newNetHarness(t, n)
	no := false
	r, err := h.client.SetNetworkPolicy(h.ctx, &api.SetNetworkPolicyRequest{ContainerId: "c2",
		Policy: &api.NetworkPolicy{AllowInternetAccess: &no, AllowOut: []string{"10.88.0.1", "10.1.2.3/8"}, DenyOut: []string{"192.0.2.0/24"}}})
	if err != nil {
		t.Fatal(err)
	}
	if r.SandboxId != "sb1" || r.Device != "veth1234" || r.Policy.GetAllowInternetAccess() || len(r.Policy.AllowOut) != 2 ||
		r.Policy.AllowOut[0] != "10.88.0.1/32" || r.Policy.AllowOut[1] != "10.0.0.0/8" || r.Policy.DenyOut[0] != "192.0.2.0/24" ||
		len(r.Counters) != 1 || r.Counters[0].Packets != 2 || r.Counters[0].Action != "no-internet" {
		t.Fatalf("set: %+v", r)
	}
	g, err := h.client.GetNetworkPolicy(h.ctx, &api.GetNetworkPolicyRequest{ContainerId: "c1"})
	if err != nil || g.Policy.GetAllowInternetAccess() || len(g.Policy.AllowOut) != 2 {
		t.Fatalf("get: %+v %v", g, err)
	}

	// Refused before the network is touched, naming the field.
	_, err = h.client.SetNetworkPolicy(h.ctx, &api.SetNetworkPolicyRequest{ContainerId: "c1",
		Policy: &api.NetworkPolicy{AllowOut: []string{"10.0.0.0/8", "10.0.0.0/99"}}})
	wantCode(t, err, codes.InvalidArgument, "allow_out[1]")
	_, err = h.client.SetNetworkPolicy(h.ctx, &api.SetNetworkPolicyRequest{ContainerId: "c1",
		Policy: &api.NetworkPolicy{DenyOut: []string{"example.com"}}})
	wantCode(t, err, codes.InvalidArgument, "deny_out[0]")
	_, err = h.client.SetNetworkPolicy(h.ctx, &api.SetNetworkPolicyRequest{ContainerId: "nope"})
	wantCode(t, err, codes.NotFound, "nope")
	if n.sets != 1 {
		t.Errorf("%d policies set, want 1 (bad requests must not reach the network)", n.sets)
	}
	// No policy: open.
	r, err = h.client.SetNetworkPolicy(h.ctx, &api.SetNetworkPolicyRequest{ContainerId: "c1"})
	if err != nil || !r.Policy.GetAllowInternetAccess() || len(r.Counters) != 0 || !n.policy.IsOpen() {
		t.Fatalf("open: %+v %v", r, err)
	}
}

func TestNetworkPolicyHostNetwork(t *testing.T) {
	h := newHarness(t)
	_, err := h.client.SetNetworkPolicy(h.ctx, &api.SetNetworkPolicyRequest{ContainerId: "c1", Policy: &api.NetworkPolicy{DenyOut: []string{"0.0.0.0/0"}}})
	wantCode(t, err, codes.FailedPrecondition, "no network of its own")
	_, err = h.client.GetNetworkPolicy(h.ctx, &api.GetNetworkPolicyRequest{ContainerId: "c1"})
	wantCode(t, err, codes.FailedPrecondition, "no network of its own")
}
