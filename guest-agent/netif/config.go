package netif

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Bounds on a network configuration from the host: the agent refuses more
// rather than spend guest memory or netlink calls on it.
const (
	MaxInterfaces  = 8
	MaxAddresses   = 16
	MaxRoutes      = 64
	MaxNameservers = 8
	MaxSearch      = 32
	MaxOptions     = 32
	// maxDNSField bounds one search domain or option (a DNS name is at most 253 bytes).
	maxDNSField = 253
	MinMTU      = 68
	MaxMTU      = 65535
)

// ErrInvalid marks a configuration refused before anything was changed.
var ErrInvalid = errors.New("invalid network configuration")

// Config is the guest's network configuration: interfaces found by MAC,
// and what /etc/resolv.conf says (nil: left alone).
type Config struct {
	Interfaces []Interface
	DNS        *DNS
}

// Interface is what one interface must look like. The whole state is given,
// so applying it twice changes nothing, and applying another one replaces it.
type Interface struct {
	// MAC is the address the interface must have.
	MAC net.HardwareAddr
	// DeviceMAC, when not nil, is the device's own address (a restored VM's
	// NIC keeps its snapshot's, which the guest may have replaced with
	// another sandbox's MAC before that snapshot: the kernel keeps the
	// device's as the permanent address); the interface is found by it, or
	// by MAC once it has that (a re-apply), and MAC is set on it.
	DeviceMAC net.HardwareAddr
	// MTU, 0 to keep the current one.
	MTU int
	// Addrs are the interface's addresses with their prefix lengths.
	Addrs []netip.Prefix
	// Routes go through this interface.
	Routes []Route
	// Name is the host's name for it (informational: logs).
	Name string
}

// Route is one route through its interface. A zero Dst (!Dst.IsValid()) is
// the default route of Gateway's family.
type Route struct {
	Dst     netip.Prefix
	Gateway netip.Addr
}

// DNS is the content of resolv.conf.
type DNS struct {
	Nameservers []netip.Addr
	Search      []string
	Options     []string
}

// RawInterface, RawRoute and RawDNS are the textual form a request carries
// (the agent protocol's fields); Parse validates them into a Config.
type RawInterface struct {
	MAC, DeviceMAC, Name string
	MTU                  uint32
	Addresses            []string
	Routes               []RawRoute
}

// RawRoute is Route as text.
type RawRoute struct{ Destination, Gateway string }

// RawDNS is DNS as text.
type RawDNS struct{ Nameservers, Search, Options []string }

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
}

// Parse checks a configuration from the host (untrusted: every count and
// length is bounded, every field named in the error) and returns it.
func Parse(ifs []RawInterface, dns *RawDNS) (Config, error) {
	var c Config
	if len(ifs) > MaxInterfaces {
		return c, invalid("%d interfaces, at most %d", len(ifs), MaxInterfaces)
	}
	seen := map[string]int{}
	for i, r := range ifs {
		in, err := parseInterface(r)
		if err != nil {
			return Config{}, fmt.Errorf("interfaces[%d]: %w", i, err)
		}
		for _, m := range []net.HardwareAddr{in.MAC, in.DeviceMAC} {
			if m == nil {
				continue
			}
			if j, ok := seen[m.String()]; ok && j != i {
				return Config{}, invalid("interfaces[%d]: mac %s already names interfaces[%d]", i, m, j)
			}
			seen[m.String()] = i
		}
		c.Interfaces = append(c.Interfaces, in)
	}
	if dns != nil {
		d, err := parseDNS(*dns)
		if err != nil {
			return Config{}, fmt.Errorf("dns: %w", err)
		}
		c.DNS = &d
	}
	return c, nil
}

// ParseMAC accepts a unicast 48-bit Ethernet address, XX:XX:XX:XX:XX:XX.
func ParseMAC(s string) (net.HardwareAddr, error) {
	m, err := net.ParseMAC(s)
	if err != nil || len(m) != 6 || len(s) != 17 || strings.Count(s, ":") != 5 {
		return nil, invalid("%q is not a MAC address XX:XX:XX:XX:XX:XX", s)
	}
	if m[0]&1 != 0 {
		return nil, invalid("%s is a multicast MAC address", s)
	}
	if bytes.Equal(m, make(net.HardwareAddr, 6)) {
		return nil, invalid("%s is the all-zero MAC address", s)
	}
	return m, nil
}

func parseInterface(r RawInterface) (Interface, error) {
	var in Interface
	var err error
	if in.MAC, err = ParseMAC(r.MAC); err != nil {
		return in, fmt.Errorf("mac: %w", err)
	}
	if r.DeviceMAC != "" {
		if in.DeviceMAC, err = ParseMAC(r.DeviceMAC); err != nil {
			return in, fmt.Errorf("device_mac: %w", err)
		}
		if bytes.Equal(in.DeviceMAC, in.MAC) {
			in.DeviceMAC = nil
		}
	}
	if len(r.Name) > 15 || strings.ContainsAny(r.Name, "/ \n\x00") {
		return in, invalid("name %q: not an interface name (1..15 bytes, no '/', space or newline)", r.Name)
	}
	in.Name = r.Name
	if r.MTU != 0 && (r.MTU < MinMTU || r.MTU > MaxMTU) {
		return in, invalid("mtu %d: want 0 (keep) or %d..%d", r.MTU, MinMTU, MaxMTU)
	}
	in.MTU = int(r.MTU)
	if len(r.Addresses) > MaxAddresses {
		return in, invalid("%d addresses, at most %d", len(r.Addresses), MaxAddresses)
	}
	for i, a := range r.Addresses {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			return in, invalid("addresses[%d]: %q is not an address/prefix-length (10.88.0.5/16): %v", i, a, err)
		}
		if p.Addr().Zone() != "" || p.Addr().IsUnspecified() || p.Addr().IsMulticast() || p.Addr().IsLoopback() {
			return in, invalid("addresses[%d]: %s cannot be an interface's address", i, a)
		}
		in.Addrs = append(in.Addrs, p)
	}
	if len(r.Routes) > MaxRoutes {
		return in, invalid("%d routes, at most %d", len(r.Routes), MaxRoutes)
	}
	for i, rr := range r.Routes {
		rt, err := parseRoute(rr)
		if err != nil {
			return in, fmt.Errorf("routes[%d]: %w", i, err)
		}
		in.Routes = append(in.Routes, rt)
	}
	return in, nil
}

func parseRoute(r RawRoute) (Route, error) {
	var rt Route
	if r.Gateway != "" {
		g, err := netip.ParseAddr(r.Gateway)
		if err != nil || g.Zone() != "" || g.IsUnspecified() || g.IsMulticast() {
			return rt, invalid("gateway %q is not a unicast IP address", r.Gateway)
		}
		rt.Gateway = g
	}
	if r.Destination == "" {
		if !rt.Gateway.IsValid() {
			return rt, invalid("a default route (no destination) needs a gateway")
		}
		return rt, nil
	}
	d, err := netip.ParsePrefix(r.Destination)
	if err != nil || d.Addr().Zone() != "" {
		return rt, invalid("destination %q is not a network in CIDR form (10.0.0.0/8)", r.Destination)
	}
	rt.Dst = d.Masked()
	if rt.Gateway.IsValid() && rt.Gateway.Is4() != rt.Dst.Addr().Is4() {
		return rt, invalid("gateway %s and destination %s are of different families", rt.Gateway, rt.Dst)
	}
	return rt, nil
}

// Is4 reports whether the route is IPv4.
func (r Route) Is4() bool {
	if r.Dst.IsValid() {
		return r.Dst.Addr().Is4()
	}
	return r.Gateway.Is4()
}

func parseDNS(r RawDNS) (DNS, error) {
	var d DNS
	if len(r.Nameservers) > MaxNameservers {
		return d, invalid("%d nameservers, at most %d", len(r.Nameservers), MaxNameservers)
	}
	for i, s := range r.Nameservers {
		a, err := netip.ParseAddr(s)
		if err != nil || a.IsUnspecified() || a.IsMulticast() {
			return d, invalid("nameservers[%d]: %q is not a unicast IP address", i, s)
		}
		d.Nameservers = append(d.Nameservers, a)
	}
	if len(r.Search) > MaxSearch {
		return d, invalid("%d search domains, at most %d", len(r.Search), MaxSearch)
	}
	if len(r.Options) > MaxOptions {
		return d, invalid("%d options, at most %d", len(r.Options), MaxOptions)
	}
	for _, f := range []struct {
		name string
		in   []string
		out  *[]string
	}{{"search", r.Search, &d.Search}, {"options", r.Options, &d.Options}} {
		for i, s := range f.in {
			// One word each: resolv.conf is whitespace-separated lines.
			if s == "" || len(s) > maxDNSField || strings.IndexFunc(s, func(c rune) bool { return c <= ' ' || c > '~' || c == '#' || c == ';' }) >= 0 {
				return d, invalid("%s[%d]: %q is not one printable word of at most %d bytes", f.name, i, s, maxDNSField)
			}
			*f.out = append(*f.out, s)
		}
	}
	return d, nil
}

// ResolvConf renders d as resolv.conf.
func (d DNS) ResolvConf() []byte {
	var b bytes.Buffer
	b.WriteString("# written by the cube guest agent from the sandbox's network configuration\n")
	if len(d.Search) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(d.Search, " "))
	}
	for _, n := range d.Nameservers {
		fmt.Fprintf(&b, "nameserver %s\n", n)
	}
	if len(d.Options) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(d.Options, " "))
	}
	return b.Bytes()
}
