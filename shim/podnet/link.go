package podnet

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/shim/sandbox"
)

// All of this runs inside the pod's network namespace (inNetns): the
// package-level netlink calls open their socket in the calling thread's
// namespace.

// findCNILink returns the interface CNI made: the one with a global address
// that is neither loopback nor a tap (eth0 preferred when several qualify).
func findCNILink() (netlink.Link, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	var cands []netlink.Link
	var names []string
	for _, l := range links {
		a := l.Attrs()
		names = append(names, a.Name)
		if a.Flags&net.FlagLoopback != 0 || l.Type() == "tuntap" || len(a.HardwareAddr) != 6 {
			continue
		}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("%s: list addresses: %w", a.Name, err)
		}
		if slices.ContainsFunc(addrs, func(ad netlink.Addr) bool { return ad.Scope == unix.RT_SCOPE_UNIVERSE }) {
			cands = append(cands, l)
		}
	}
	if len(cands) == 0 {
		return nil, fmt.Errorf("no interface with an address besides loopback (interfaces: %v): did CNI configure the pod (containerd's CNI config and plugins)? %w",
			names, errdefs.ErrFailedPrecondition)
	}
	for _, l := range cands {
		if l.Attrs().Name == "eth0" {
			return l, nil
		}
	}
	return cands[0], nil
}

// describe reads what the guest's NIC takes over from l: MAC, MTU, global
// addresses, and the non-kernel routes of the main table through l (the
// kernel's prefix routes the guest makes itself from the addresses).
func describe(l netlink.Link) (sandbox.NetInterface, error) {
	a := l.Attrs()
	in := sandbox.NetInterface{Name: a.Name, MAC: macString(a.HardwareAddr), MTU: uint32(a.MTU)}
	addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return in, fmt.Errorf("%s: list addresses: %w", a.Name, err)
	}
	for _, ad := range addrs {
		if ad.Scope != unix.RT_SCOPE_UNIVERSE || ad.IPNet == nil {
			continue
		}
		in.Addresses = append(in.Addresses, ad.IPNet.String())
	}
	routes, err := netlink.RouteList(l, netlink.FAMILY_ALL)
	if err != nil {
		return in, fmt.Errorf("%s: list routes: %w", a.Name, err)
	}
	for _, r := range routes {
		if r.Protocol == unix.RTPROT_KERNEL || r.Table != 0 && r.Table != unix.RT_TABLE_MAIN {
			continue
		}
		if r.Dst != nil && r.Dst.IP.IsLinkLocalUnicast() && r.Dst.IP.To4() == nil {
			continue // fe80::/64: the guest's kernel has its own
		}
		var nr sandbox.NetRoute
		if r.Dst != nil {
			if ones, _ := r.Dst.Mask.Size(); ones != 0 || !r.Dst.IP.IsUnspecified() {
				nr.Destination = r.Dst.String()
			}
		}
		if r.Gw != nil {
			nr.Gateway = r.Gw.String()
		}
		if nr.Destination == "" && nr.Gateway == "" {
			continue // a default route without gateway (a device route): nothing the guest can take
		}
		in.Routes = append(in.Routes, nr)
	}
	if len(in.Addresses) == 0 {
		return in, fmt.Errorf("%s has no global address: %w", a.Name, errdefs.ErrFailedPrecondition)
	}
	return in, nil
}

// makeTap creates the tap name in the calling thread's namespace, attached
// to the returned file (IFF_TAP|IFF_NO_PI|IFF_VNET_HDR, as cube-vmm wants
// for offloads), not persistent, with mtu, up.
func makeTap(name string, mtu int) (*os.File, netlink.Link, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/net/tun (is the tun module loaded?): %w", err)
	}
	f := os.NewFile(uintptr(fd), "/dev/net/tun:"+name)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("tap %q: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		f.Close()
		if errors.Is(err, unix.EBUSY) {
			return nil, nil, fmt.Errorf("tap %s exists in the pod's namespace and is attached (a VM of this pod still running?): %w: %w", name, err, errdefs.ErrAlreadyExists)
		}
		return nil, nil, fmt.Errorf("create tap %s (TUNSETIFF): %w", name, err)
	}
	// The kernel's default (10) is short for a VM's bursts; a veth has 1000.
	l, err := netlink.LinkByName(name)
	if err == nil && mtu > 0 {
		err = netlink.LinkSetMTU(l, mtu)
	}
	if err == nil {
		err = netlink.LinkSetTxQLen(l, 1000)
	}
	if err == nil {
		err = netlink.LinkSetUp(l)
	}
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("set up tap %s: %w", name, err)
	}
	return f, l, nil
}

// deleteTap removes the tap with index idx if it still exists (it goes by
// itself with its last fd; a leftover means some process still holds one).
func deleteTap(idx int) error {
	l, err := netlink.LinkByIndex(idx)
	if err != nil {
		return nil // gone
	}
	if l.Type() != "tuntap" || l.Attrs().Name != TapName {
		return nil // the index was reused by something else
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete tap %s: %w", TapName, err)
	}
	return nil
}

// ingressHandle is the ingress qdisc's handle, ffff:.
var ingressHandle = netlink.MakeHandle(0xffff, 0)

// redirect joins the two interfaces: on each, an ingress qdisc and a
// match-all u32 filter whose mirred action redirects every frame to the
// other's egress (tc qdisc add dev X ingress; tc filter add dev X parent
// ffff: protocol all u32 match u8 0 0 action mirred egress redirect dev Y).
//
// Ordering: the CNI interface's redirect is added last, so no frame is
// taken away from the namespace before the way back exists.
func redirect(a *attachment) error {
	for _, p := range [][2]int{{a.tapIndex, a.cniIndex}, {a.cniIndex, a.tapIndex}} {
		q := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: p[0], Handle: ingressHandle, Parent: netlink.HANDLE_INGRESS}}
		if err := netlink.QdiscAdd(q); err != nil {
			if errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("interface %d already has an ingress qdisc (another VM or tool redirects it): %w: %w", p[0], err, errdefs.ErrAlreadyExists)
			}
			return fmt.Errorf("add ingress qdisc to interface %d (kernel module sch_ingress): %w", p[0], err)
		}
		a.qdiscs = append(a.qdiscs, p[0])
		f := &netlink.U32{
			FilterAttrs: netlink.FilterAttrs{LinkIndex: p[0], Parent: ingressHandle, Priority: 1, Protocol: unix.ETH_P_ALL},
			Actions:     []netlink.Action{netlink.NewMirredAction(p[1])},
		}
		if err := netlink.FilterAdd(f); err != nil {
			return fmt.Errorf("add redirect filter from interface %d to %d (kernel modules cls_u32, act_mirred): %w", p[0], p[1], err)
		}
	}
	return nil
}

// unredirect removes the ingress qdiscs redirect added (their filters go
// with them); one already gone is skipped, one it did not add is not touched.
func unredirect(a *attachment) {
	for _, idx := range a.qdiscs {
		q := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx, Handle: ingressHandle, Parent: netlink.HANDLE_INGRESS}}
		_ = netlink.QdiscDel(q)
	}
	a.qdiscs = nil
}
