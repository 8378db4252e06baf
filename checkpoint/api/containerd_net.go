package api

import (
	"context"
	"fmt"
	"net"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cube-runtime/cube/checkpoint/sandboxnet"
	snapapi "github.com/cube-runtime/cube/shim/snapshotapi"
)

// withNetwork puts Cube's default network in a sandbox's spec: the
// createRuntime and poststop hooks (`cube internal oci-hook`) the shim runs
// on the host against the network namespace it holds for the VM, and the
// first egress policy as the annotations the shim reads.
func (c *Containerd) withNetwork(p NetworkPolicy) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		hook := func(phase string) specs.Hook {
			args := append([]string{c.Net.Hook, "internal", "oci-hook"}, c.Net.CNI.Args()...)
			return specs.Hook{Path: c.Net.Hook, Args: append(args, phase),
				Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}}
		}
		if s.Hooks == nil {
			s.Hooks = &specs.Hooks{}
		}
		s.Hooks.CreateRuntime = append(s.Hooks.CreateRuntime, hook("createRuntime"))
		s.Hooks.Poststop = append(s.Hooks.Poststop, hook("poststop"))
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		for k, v := range p.annotations() {
			s.Annotations[k] = v
		}
		// The spec's own network namespace (containerd's default spec has
		// one without a path) is what tells the shim to run the hooks.
		return oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace})(context.Background(), nil, nil, s)
	}
}

// SetNetworkPolicy implements Networker through the sandbox's shim.
func (c *Containerd) SetNetworkPolicy(ctx context.Context, id string, p NetworkPolicy) (NetworkPolicy, error) {
	ctx = c.ctx(ctx)
	sh, _, err := c.shimOf(ctx, id)
	if err != nil {
		return NetworkPolicy{}, err
	}
	defer sh.Close()
	allow := p.AllowInternetAccess
	resp, err := sh.SetNetworkPolicy(ctx, &snapapi.SetNetworkPolicyRequest{ContainerId: id,
		Policy: &snapapi.NetworkPolicy{AllowInternetAccess: &allow, AllowOut: p.AllowOut, DenyOut: p.DenyOut}})
	if err != nil {
		return NetworkPolicy{}, fmt.Errorf("sandbox %s: set its egress policy: %w", id, err)
	}
	// Ordering: recorded in the container's spec once in force, so that a
	// fork or restore of the sandbox starts with it (a clone made from the
	// spec's older, wider policy would escape the change).
	if err := c.Conn.RecordPolicy(ctx, id, resp.GetPolicy()); err != nil {
		return NetworkPolicy{}, fmt.Errorf("sandbox %s: the new egress policy is in force, but: %w (set it again)", id, err)
	}
	out := NetworkPolicy{AllowInternetAccess: true, AllowOut: []string{}, DenyOut: []string{}}
	if pol := resp.GetPolicy(); pol != nil {
		out.AllowInternetAccess = pol.AllowInternetAccess == nil || *pol.AllowInternetAccess
		out.AllowOut = append(out.AllowOut, pol.AllowOut...)
		out.DenyOut = append(out.DenyOut, pol.DenyOut...)
	}
	for _, ctr := range resp.GetCounters() {
		if out.Dropped == nil {
			out.Dropped = map[string]uint64{}
		}
		if ctr.Action != "allow" {
			out.Dropped[ctr.Action+" "+ctr.Cidr] = ctr.Packets
		}
	}
	return out, nil
}

// Address implements Networker: the address CNI gave the sandbox.
func (c *Containerd) Address(ctx context.Context, id string) (net.IP, error) {
	if c.Net == nil {
		return nil, fmt.Errorf("sandbox %s has no network: %w", id, errdefs.ErrNotFound)
	}
	if _, err := c.load(c.ctx(ctx), id); err != nil {
		return nil, err
	}
	return sandboxnet.Address(c.Net.CNI, id)
}
