package netif

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ErrNoInterface is returned when no interface has the MAC a configuration names.
var ErrNoInterface = errors.New("no such interface")

// Applied says what Apply did to one interface.
type Applied struct {
	Name         string
	MACChanged   bool
	AddrsAdded   int
	AddrsRemoved int
	RoutesSet    int
	RoutesGone   int
}

// Apply configures every interface of c in the calling thread's network
// namespace (callers that changed it must hold runtime.LockOSThread), in
// order, and stops at the first failure. It does not touch resolv.conf
// (c.DNS): the caller writes that file where it belongs.
func Apply(c Config) ([]Applied, error) {
	var done []Applied
	for i, in := range c.Interfaces {
		a, err := ApplyInterface(in)
		if err != nil {
			return done, fmt.Errorf("interfaces[%d] (mac %s): %w", i, in.MAC, err)
		}
		done = append(done, a)
	}
	return done, nil
}

// findLink returns the interface whose device address is DeviceMAC (when
// set), else the one with MAC. The device address is the permanent one the
// driver read from the NIC (IFLA_PERM_ADDRESS), or the current one: a
// sandbox restored once runs under a new MAC on the same device, and a
// snapshot of it records the device's MAC, so a restore of that snapshot
// must find the interface by what the device says, not what the guest set.
func findLink(in Interface) (netlink.Link, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	var byMAC netlink.Link
	var seen []string
	for _, l := range links {
		a := l.Attrs()
		s := a.Name + "=" + a.HardwareAddr.String()
		if len(a.PermHWAddr) > 0 && !bytes.Equal(a.PermHWAddr, a.HardwareAddr) {
			s += " (device " + a.PermHWAddr.String() + ")"
		}
		seen = append(seen, s)
		if in.DeviceMAC != nil && (bytes.Equal(a.PermHWAddr, in.DeviceMAC) || bytes.Equal(a.HardwareAddr, in.DeviceMAC)) {
			return l, nil
		}
		if byMAC == nil && bytes.Equal(a.HardwareAddr, in.MAC) {
			byMAC = l
		}
	}
	if byMAC != nil {
		return byMAC, nil
	}
	want := in.MAC.String()
	if in.DeviceMAC != nil {
		want = in.DeviceMAC.String() + " (or " + want + ")"
	}
	return nil, fmt.Errorf("%w with mac %s (interfaces: %v)", ErrNoInterface, want, seen)
}

// ApplyInterface makes one interface look like in: MAC, MTU, up, exactly
// in.Addrs (IPv6 link-local addresses stay: the kernel makes them), and
// exactly in.Routes among the non-kernel routes of the main table through it.
func ApplyInterface(in Interface) (Applied, error) {
	var res Applied
	link, err := findLink(in)
	if err != nil {
		return res, err
	}
	a := link.Attrs()
	res.Name = a.Name
	if !bytes.Equal(a.HardwareAddr, in.MAC) {
		// virtio-net without a control queue takes a new address while up
		// (IFF_LIVE_ADDR_CHANGE): the device does no MAC filtering.
		if err := netlink.LinkSetHardwareAddr(link, in.MAC); err != nil {
			return res, fmt.Errorf("%s: set mac %s: %w", a.Name, in.MAC, err)
		}
		res.MACChanged = true
	}
	if in.MTU != 0 && a.MTU != in.MTU {
		if err := netlink.LinkSetMTU(link, in.MTU); err != nil {
			return res, fmt.Errorf("%s: set mtu %d: %w", a.Name, in.MTU, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return res, fmt.Errorf("%s: set up: %w", a.Name, err)
	}
	if res.AddrsAdded, res.AddrsRemoved, err = syncAddrs(link, in.Addrs); err != nil {
		return res, err
	}
	if res.RoutesSet, res.RoutesGone, err = syncRoutes(link, in.Routes); err != nil {
		return res, err
	}
	if res.MACChanged || res.AddrsRemoved > 0 {
		// Neighbours learnt on the old network (a restored VM's) are wrong on the new one.
		flushNeighbours(link)
	}
	return res, nil
}

func prefixOf(ip net.IP, mask net.IPMask) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}

func ipNet(p netip.Prefix) *net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), bits)}
}

func syncAddrs(link netlink.Link, want []netip.Prefix) (added, removed int, err error) {
	name := link.Attrs().Name
	have, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return 0, 0, fmt.Errorf("%s: list addresses: %w", name, err)
	}
	present := map[netip.Prefix]bool{}
	for _, h := range have {
		p, ok := prefixOf(h.IP, h.Mask)
		if !ok || p.Addr().IsLinkLocalUnicast() && p.Addr().Is6() {
			continue
		}
		if slices.Contains(want, p) {
			present[p] = true
			continue
		}
		if err := netlink.AddrDel(link, &h); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return added, removed, fmt.Errorf("%s: remove address %s: %w", name, p, err)
		}
		removed++
	}
	for _, p := range want {
		if present[p] {
			continue
		}
		addr := &netlink.Addr{IPNet: ipNet(p)}
		if p.Addr().Is6() {
			// The host already checked the address on its network (CNI): no DAD delay before it works.
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrReplace(link, addr); err != nil {
			return added, removed, fmt.Errorf("%s: add address %s: %w", name, p, err)
		}
		added++
	}
	return added, removed, nil
}

// routeKey identifies a route by destination and gateway; the default
// route's destination is the family's zero prefix.
func routeKey(dst *net.IPNet, gw net.IP, family int) (netip.Prefix, netip.Addr) {
	var d netip.Prefix
	if dst != nil {
		d, _ = prefixOf(dst.IP, dst.Mask)
		d = d.Masked()
	} else if family == unix.AF_INET6 {
		d = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	} else {
		d = netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	}
	g, _ := netip.AddrFromSlice(gw)
	return d, g.Unmap()
}

func (r Route) key() (netip.Prefix, netip.Addr) {
	if r.Dst.IsValid() {
		return r.Dst, r.Gateway
	}
	if r.Gateway.Is6() {
		return netip.PrefixFrom(netip.IPv6Unspecified(), 0), r.Gateway
	}
	return netip.PrefixFrom(netip.IPv4Unspecified(), 0), r.Gateway
}

func syncRoutes(link netlink.Link, want []Route) (set, gone int, err error) {
	name, idx := link.Attrs().Name, link.Attrs().Index
	type key struct {
		d netip.Prefix
		g netip.Addr
	}
	wanted := map[key]bool{}
	for _, r := range want {
		d, g := r.key()
		wanted[key{d, g}] = true
	}
	have, err := netlink.RouteList(link, netlink.FAMILY_ALL)
	if err != nil {
		return 0, 0, fmt.Errorf("%s: list routes: %w", name, err)
	}
	for _, h := range have {
		if h.Protocol == unix.RTPROT_KERNEL || h.Table != 0 && h.Table != unix.RT_TABLE_MAIN {
			continue // the kernel's prefix and link-local routes follow the addresses
		}
		d, g := routeKey(h.Dst, h.Gw, h.Family)
		if wanted[key{d, g}] {
			continue
		}
		if err := netlink.RouteDel(&h); err != nil && !errors.Is(err, unix.ESRCH) {
			return set, gone, fmt.Errorf("%s: remove route %s via %s: %w", name, d, g, err)
		}
		gone++
	}
	// Ordering: directly connected routes first, so a gateway they make
	// reachable (a /32 address's 169.254.1.1, say) is there for the routes through it.
	ordered := slices.Clone(want)
	slices.SortStableFunc(ordered, func(a, b Route) int {
		return boolInt(a.Gateway.IsValid()) - boolInt(b.Gateway.IsValid())
	})
	for _, r := range ordered {
		d, g := r.key()
		rt := &netlink.Route{LinkIndex: idx, Dst: ipNet(d), Scope: netlink.SCOPE_UNIVERSE, Family: unix.AF_INET}
		if d.Addr().Is6() {
			rt.Family = unix.AF_INET6
		}
		if d.Bits() == 0 {
			rt.Dst = nil // the default route
		}
		if g.IsValid() {
			rt.Gw = net.IP(g.AsSlice())
		} else {
			rt.Scope = netlink.SCOPE_LINK
		}
		if err := netlink.RouteReplace(rt); err != nil {
			via := ""
			if g.IsValid() {
				via = " via " + g.String()
			}
			return set, gone, fmt.Errorf("%s: route %s%s: %w", name, d, via, err)
		}
		set++
	}
	return set, gone, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// flushNeighbours forgets the link's neighbour entries (best effort).
func flushNeighbours(link netlink.Link) {
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		ns, err := netlink.NeighList(link.Attrs().Index, fam)
		if err != nil {
			continue
		}
		for _, n := range ns {
			if n.State&netlink.NUD_PERMANENT == 0 {
				_ = netlink.NeighDel(&n)
			}
		}
	}
}
