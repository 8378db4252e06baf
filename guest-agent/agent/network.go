package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cube-runtime/cube/guest-agent/netif"
	"github.com/cube-runtime/cube/guest-agent/protocol"
)

// netMu serializes ConfigureNetwork: two configurations applied at once
// would interleave their address and route changes.
var netMu sync.Mutex

// networkConfig validates a request (every field from the host is bounded)
// into netif's form.
func networkConfig(req *protocol.ConfigureNetworkRequest) (netif.Config, error) {
	var ifs []netif.RawInterface
	if n := len(req.Interfaces); n > netif.MaxInterfaces {
		return netif.Config{}, errInvalid("%d interfaces, at most %d", n, netif.MaxInterfaces)
	}
	for _, in := range req.Interfaces {
		r := netif.RawInterface{MAC: in.Mac, DeviceMAC: in.DeviceMac, Name: in.Name, MTU: in.Mtu, Addresses: in.Addresses}
		if n := len(in.Routes); n > netif.MaxRoutes {
			return netif.Config{}, errInvalid("interface %s: %d routes, at most %d", in.Mac, n, netif.MaxRoutes)
		}
		for _, rt := range in.Routes {
			r.Routes = append(r.Routes, netif.RawRoute{Destination: rt.Destination, Gateway: rt.Gateway})
		}
		ifs = append(ifs, r)
	}
	var dns *netif.RawDNS
	if d := req.Dns; d != nil {
		dns = &netif.RawDNS{Nameservers: d.Nameservers, Search: d.Search, Options: d.Options}
	}
	c, err := netif.Parse(ifs, dns)
	if err != nil {
		return c, errInvalid("%v", err)
	}
	return c, nil
}

// ConfigureNetwork applies the host's network configuration to the guest's
// interfaces (found by MAC) and writes resolv.conf. The whole request is
// validated before anything changes; applying is idempotent.
func (s *Service) ConfigureNetwork(ctx context.Context, req *protocol.ConfigureNetworkRequest) (*protocol.ConfigureNetworkResponse, error) {
	c, err := networkConfig(req)
	if err != nil {
		return nil, err
	}
	netMu.Lock()
	defer netMu.Unlock()
	apply := s.cfg.ApplyNetwork
	if apply == nil {
		apply = netif.Apply
	}
	done, err := apply(c)
	resp := &protocol.ConfigureNetworkResponse{}
	for i, a := range done {
		resp.Interfaces = append(resp.Interfaces, a.Name)
		in := c.Interfaces[i]
		s.log.WithFields(logrus.Fields{
			"interface": a.Name, "mac": in.MAC.String(), "host_name": in.Name, "mtu": in.MTU,
			"addresses": fmt.Sprint(in.Addrs), "routes": len(in.Routes), "mac_changed": a.MACChanged,
			"addrs_added": a.AddrsAdded, "addrs_removed": a.AddrsRemoved, "routes_removed": a.RoutesGone,
		}).Info("network interface configured")
	}
	if err != nil {
		if errors.Is(err, netif.ErrNoInterface) {
			return nil, status.Errorf(codes.NotFound, "configure network: %v (does the VM have the NIC, and does the guest load virtio_net?)", err)
		}
		return nil, toStatus(err, "configure network")
	}
	if c.DNS != nil {
		path := s.cfg.ResolvConf
		if path == "" {
			path = "/etc/resolv.conf"
		}
		if err := writeFileAtomic(path, c.DNS.ResolvConf()); err != nil {
			return nil, toStatus(err, "write %s", path)
		}
		s.log.WithFields(logrus.Fields{"path": path, "nameservers": fmt.Sprint(c.DNS.Nameservers)}).Info("resolv.conf written")
	}
	return resp, nil
}

// writeFileAtomic replaces path with data (a reader never sees half a file).
func writeFileAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".cube-tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
