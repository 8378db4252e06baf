package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cube-runtime/cube/guest-agent/netif"
	"github.com/cube-runtime/cube/guest-agent/protocol"
)

// TestConfigureNetworkRPC drives ConfigureNetwork over ttrpc with a fake
// interface layer: what reaches it, resolv.conf, and the refusals (a
// malformed field named, nothing applied; an unknown MAC is NotFound).
func TestConfigureNetworkRPC(t *testing.T) {
	var got []netif.Config
	applyErr := error(nil)
	resolv := filepath.Join(t.TempDir(), "etc", "resolv.conf")
	h := newHarness(t, func(c *Config) {
		c.ResolvConf = resolv
		c.ApplyNetwork = func(nc netif.Config) ([]netif.Applied, error) {
			got = append(got, nc)
			if applyErr != nil {
				return nil, applyErr
			}
			return []netif.Applied{{Name: "eth0"}}, nil
		}
	})
	ctx := context.Background()
	req := &protocol.ConfigureNetworkRequest{
		Interfaces: []*protocol.NetInterface{{Mac: "02:42:0a:58:00:05", Name: "eth0", Mtu: 1500,
			Addresses: []string{"10.88.0.5/16"}, Routes: []*protocol.NetRoute{{Gateway: "10.88.0.1"}}}},
		Dns: &protocol.DNSConfig{Nameservers: []string{"10.96.0.10"}, Search: []string{"svc.cluster.local"}, Options: []string{"ndots:5"}},
	}
	resp, err := h.client.ConfigureNetwork(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Interfaces) != 1 || resp.Interfaces[0] != "eth0" {
		t.Errorf("response %v", resp.Interfaces)
	}
	if len(got) != 1 || got[0].Interfaces[0].MAC.String() != "02:42:0a:58:00:05" || got[0].Interfaces[0].Routes[0].Gateway.String() != "10.88.0.1" {
		t.Errorf("applied %+v", got)
	}
	b, err := os.ReadFile(resolv)
	if err != nil || !strings.Contains(string(b), "nameserver 10.96.0.10\n") || !strings.Contains(string(b), "search svc.cluster.local\n") {
		t.Errorf("resolv.conf %q %v", b, err)
	}

	// Refused before anything is applied, the field named.
	bad := &protocol.ConfigureNetworkRequest{Interfaces: []*protocol.NetInterface{{Mac: "02:42:0a:58:00:05", Addresses: []string{"10.88.0.5"}}}}
	_, err = h.client.ConfigureNetwork(ctx, bad)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "addresses[0]") {
		t.Errorf("address without prefix: %v, want InvalidArgument naming addresses[0]", err)
	}
	tooMany := &protocol.ConfigureNetworkRequest{Interfaces: make([]*protocol.NetInterface, netif.MaxInterfaces+1)}
	for i := range tooMany.Interfaces {
		tooMany.Interfaces[i] = &protocol.NetInterface{Mac: fmt.Sprintf("02:00:00:00:00:%02x", i+1)}
	}
	if _, err = h.client.ConfigureNetwork(ctx, tooMany); status.Code(err) != codes.InvalidArgument {
		t.Errorf("too many interfaces: %v", err)
	}
	if len(got) != 1 {
		t.Errorf("a refused request reached the interfaces: %d applies", len(got))
	}

	applyErr = fmt.Errorf("interfaces[0]: %w with mac 02:42:0a:58:00:05", netif.ErrNoInterface)
	_, err = h.client.ConfigureNetwork(ctx, req)
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "virtio_net") {
		t.Errorf("unknown MAC: %v, want NotFound with the hint", err)
	}
	applyErr = errors.New("boom")
	if _, err = h.client.ConfigureNetwork(ctx, req); status.Code(err) != codes.Internal {
		t.Errorf("apply failure: %v, want Internal", err)
	}
}
