package snapshotsvc

import (
	"context"
	"fmt"

	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/shim/egress"
	api "github.com/cube-runtime/cube/shim/snapshotapi"
)

// SetNetworkPolicy implements api.SnapshotsService: the request's policy
// (checked first: a bad CIDR is refused naming its field) replaces the
// sandbox's.
func (s *Service) SetNetworkPolicy(ctx context.Context, req *api.SetNetworkPolicyRequest) (*api.NetworkPolicyResponse, error) {
	p, err := PolicyFromAPI(req.Policy)
	if err != nil {
		return nil, errOut(fmt.Errorf("network policy of %.64q: %w", req.ContainerId, err))
	}
	sb, err := s.sandboxOf("set the network policy", req.ContainerId)
	if err != nil {
		return nil, errOut(err)
	}
	en, err := sb.Egress()
	if err != nil {
		return nil, errOut(err)
	}
	if err := en.SetEgressPolicy(ctx, p); err != nil {
		return nil, errOut(fmt.Errorf("network policy of sandbox %s: %w", sb.ID(), err))
	}
	s.o.Log.WithFields(logrus.Fields{"sandbox": sb.ID(), "container": req.ContainerId, "policy": p.String()}).Info("network policy set")
	return s.networkPolicy(ctx, sb.ID(), en)
}

// GetNetworkPolicy implements api.SnapshotsService.
func (s *Service) GetNetworkPolicy(ctx context.Context, req *api.GetNetworkPolicyRequest) (*api.NetworkPolicyResponse, error) {
	sb, err := s.sandboxOf("get the network policy", req.ContainerId)
	if err != nil {
		return nil, errOut(err)
	}
	en, err := sb.Egress()
	if err != nil {
		return nil, errOut(err)
	}
	return s.networkPolicy(ctx, sb.ID(), en)
}

func (s *Service) networkPolicy(ctx context.Context, id string, en interface {
	EgressStatus(context.Context) (egress.Status, error)
}) (*api.NetworkPolicyResponse, error) {
	st, err := en.EgressStatus(ctx)
	if err != nil {
		return nil, errOut(fmt.Errorf("network policy of sandbox %s: %w", id, err))
	}
	resp := &api.NetworkPolicyResponse{SandboxId: id, Policy: PolicyToAPI(st.Policy), Device: st.Device}
	for _, c := range st.Counters {
		resp.Counters = append(resp.Counters, &api.NetworkRuleCounter{Action: c.Action, Cidr: c.CIDR, Packets: c.Packets, Bytes: c.Bytes})
	}
	return resp, nil
}

// PolicyFromAPI checks and converts a request's policy (nil: open).
func PolicyFromAPI(p *api.NetworkPolicy) (egress.Policy, error) {
	if p == nil {
		return egress.Open(), nil
	}
	return egress.Parse(p.AllowInternetAccess == nil || *p.AllowInternetAccess, p.AllowOut, p.DenyOut)
}

// PolicyToAPI converts a policy for a reply.
func PolicyToAPI(p egress.Policy) *api.NetworkPolicy {
	allow, deny := p.Strings()
	internet := p.AllowInternet
	return &api.NetworkPolicy{AllowInternetAccess: &internet, AllowOut: allow, DenyOut: deny}
}
