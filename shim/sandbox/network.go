package sandbox

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/guest-agent/protocol"
	"github.com/cube-runtime/cube/shim/egress"
)

// NIC is one virtio-net device of the VM: an attached tap the VMM inherits
// (cube-vmm -net fd=N) and the MAC the guest's device gets.
type NIC struct {
	Tap *os.File
	MAC string
	// NoBackend: no tap (Tap nil): a device whose frames go nowhere
	// (cube-vmm -net none), an automatic template's NIC.
	NoBackend bool
}

// NetworkConfig mirrors cube.agent.v1.ConfigureNetworkRequest: what the
// guest's interfaces must look like.
type NetworkConfig struct {
	Interfaces []NetInterface
	// DNS, when set, becomes the guest's /etc/resolv.conf.
	DNS *DNSConfig
}

// NetInterface mirrors cube.agent.v1.NetInterface.
type NetInterface struct {
	// MAC the guest interface must have; DeviceMAC the one its device has
	// now, when they differ (a restored VM). Name is the host's name for it.
	MAC, DeviceMAC, Name string
	MTU                  uint32
	Addresses            []string // CIDR
	Routes               []NetRoute
}

// NetRoute mirrors cube.agent.v1.NetRoute ("" destination: default route).
type NetRoute struct{ Destination, Gateway string }

// DNSConfig mirrors cube.agent.v1.DNSConfig.
type DNSConfig struct{ Nameservers, Search, Options []string }

// Network is the host side of a sandbox's network (shim/podnet: a CNI
// network namespace). Attach runs before the VMM starts and returns the
// NICs to give it and the configuration the agent applies before the first
// container; Detach undoes Attach once the VMM is gone (and on every failure
// after Attach). Detach must be idempotent.
type Network interface {
	Attach(ctx context.Context) (NetworkAttachment, error)
	Detach(ctx context.Context) error
}

// NetworkAttachment is what Network.Attach made.
type NetworkAttachment struct {
	NICs  []NIC
	Guest NetworkConfig
}

// attachNetwork runs o.Network's Attach (nothing without one). A template
// snapshot's VM has the devices it was snapshotted with: no NIC can be added
// to it, so a networked sandbox starts only from an automatic template made
// with its NICs (chooseTemplate), not from a configured `template`.
func (s *Sandbox) attachNetwork(ctx context.Context) (*NetworkAttachment, error) {
	if s.o.Network == nil {
		return nil, nil
	}
	if s.o.Template != "" && s.restore == nil && s.templateNICs == nil {
		return nil, fmt.Errorf("sandbox %s has a network (a CNI network namespace) but starts from template %s, whose VM has no NIC to connect: unset `template` in the shim config for pods with pod networking: %w",
			s.o.ID, s.o.Template, errdefs.ErrFailedPrecondition)
	}
	a, err := s.o.Network.Attach(ctx)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: network: %w", s.o.ID, err)
	}
	return &a, nil
}

// closeTaps closes the shim's copies of the tap fds once the VMM holds its
// own (or failed to start): the taps then live exactly as long as the VMM.
func closeTaps(a *NetworkAttachment) {
	if a == nil {
		return
	}
	for _, n := range a.NICs {
		if n.Tap != nil {
			n.Tap.Close()
		}
	}
}

// detachNetwork undoes attachNetwork (once the VMM is gone).
func (s *Sandbox) detachNetwork() {
	if s.o.Network == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), networkDetachTimeout)
	defer cancel()
	if err := s.o.Network.Detach(ctx); err != nil {
		s.o.Log.WithError(err).Warn("sandbox network not fully removed")
	}
}

// configureGuestNetwork has the agent apply the attachment's configuration.
func configureGuestNetwork(ctx context.Context, agent AgentClient, a *NetworkAttachment) error {
	if a == nil || len(a.Guest.Interfaces) == 0 && a.Guest.DNS == nil {
		return nil
	}
	if err := agent.ConfigureNetwork(ctx, a.Guest); err != nil {
		return fmt.Errorf("configure the guest's network: %w", err)
	}
	return nil
}

// netRequest converts c to the agent protocol's request.
func netRequest(c NetworkConfig) *protocol.ConfigureNetworkRequest {
	req := &protocol.ConfigureNetworkRequest{}
	for _, in := range c.Interfaces {
		pi := &protocol.NetInterface{Mac: in.MAC, DeviceMac: in.DeviceMAC, Name: in.Name, Mtu: in.MTU, Addresses: in.Addresses}
		for _, r := range in.Routes {
			pi.Routes = append(pi.Routes, &protocol.NetRoute{Destination: r.Destination, Gateway: r.Gateway})
		}
		req.Interfaces = append(req.Interfaces, pi)
	}
	if c.DNS != nil {
		req.Dns = &protocol.DNSConfig{Nameservers: c.DNS.Nameservers, Search: c.DNS.Search, Options: c.DNS.Options}
	}
	return req
}

func (a *protocolAgent) ConfigureNetwork(ctx context.Context, c NetworkConfig) error {
	_, err := a.c.ConfigureNetwork(ctx, netRequest(c))
	return err
}

// networkDetachTimeout bounds Network.Detach at teardown.
const networkDetachTimeout = 10 * time.Second

// netArgs are cube-vmm's -net flags for nets: fd 3+i is nets[i].Tap
// (exec.Cmd.ExtraFiles, in the same order).
func netArgs(nets []NIC) []string {
	var a []string
	for i, n := range nets {
		v := "fd=" + strconv.Itoa(3+i)
		if n.NoBackend {
			v = "none" // its ExtraFiles entry is nil: fd 3+i is closed in the VMM
		}
		if n.MAC != "" {
			v += ",mac=" + n.MAC
		}
		a = append(a, "-net", v)
	}
	return a
}

func validateNIC(i int, n NIC) error {
	if n.Tap == nil && !n.NoBackend {
		return fmt.Errorf("net %d: no tap file: %w", i, errdefs.ErrInvalidArgument)
	}
	if n.Tap != nil && n.NoBackend {
		return fmt.Errorf("net %d: a tap file and no backend: %w", i, errdefs.ErrInvalidArgument)
	}
	if strings.ContainsAny(n.MAC, ", \n=") {
		return fmt.Errorf("net %d: mac %q contains a comma, space, '=' or newline: %w", i, n.MAC, errdefs.ErrInvalidArgument)
	}
	return nil
}

// HasNetwork reports whether the VM has a network from the host (a NIC the
// agent configured in the guest's initial network namespace).
func (s *Sandbox) HasNetwork() bool { return s.o.Network != nil }

// EgressNetwork is a Network whose VM's outgoing traffic the host filters
// by a policy (shim/egress; shim/podnet implements it).
type EgressNetwork interface {
	SetEgressPolicy(ctx context.Context, p egress.Policy) error
	EgressStatus(ctx context.Context) (egress.Status, error)
}

// Egress returns the sandbox's network for its egress policy; a sandbox on
// the host's network (none of its own) has none to filter.
func (s *Sandbox) Egress() (EgressNetwork, error) {
	if s.o.Network == nil {
		return nil, fmt.Errorf("sandbox %s has no network of its own (it uses the host's: a host-network pod, a plain `ctr run`): there is no link of its own to filter: %w",
			s.o.ID, errdefs.ErrFailedPrecondition)
	}
	en, ok := s.o.Network.(EgressNetwork)
	if !ok {
		return nil, fmt.Errorf("sandbox %s: its network (%T) cannot take an egress policy: %w", s.o.ID, s.o.Network, errdefs.ErrFailedPrecondition)
	}
	return en, nil
}
