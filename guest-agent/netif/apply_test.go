package netif

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// inNewNetns runs f on a locked thread in a new network namespace, which
// goes away with the thread (never unlocked): nothing is left on the host.
func runInNewNetns(t *testing.T, f func() error) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: unshare(CLONE_NEWNET) needs CAP_SYS_ADMIN and interface changes CAP_NET_ADMIN (make test runs this as root)")
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func mustParse(t *testing.T, ifs ...RawInterface) Config {
	t.Helper()
	c, err := Parse(ifs, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// state is what a test checks of an interface.
type state struct {
	mac    string
	mtu    int
	up     bool
	addrs  []string
	routes []string
}

func linkState(t *testing.T, name string) state {
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	s := state{mac: l.Attrs().HardwareAddr.String(), mtu: l.Attrs().MTU, up: l.Attrs().Flags&net.FlagUp != 0}
	as, _ := netlink.AddrList(l, netlink.FAMILY_ALL)
	for _, a := range as {
		if p, ok := prefixOf(a.IP, a.Mask); ok && !(p.Addr().Is6() && p.Addr().IsLinkLocalUnicast()) {
			s.addrs = append(s.addrs, p.String())
		}
	}
	rs, _ := netlink.RouteList(l, netlink.FAMILY_ALL)
	for _, r := range rs {
		if r.Protocol == unix.RTPROT_KERNEL {
			continue
		}
		d, g := routeKey(r.Dst, r.Gw, r.Family)
		s.routes = append(s.routes, d.String()+" via "+g.String())
	}
	slices.Sort(s.addrs)
	slices.Sort(s.routes)
	return s
}

// TestApply configures a veth end in a new network namespace as the agent
// configures the guest's NIC, re-applies the same configuration (nothing
// changes), then applies a restored sandbox's new identity (new MAC and
// address, found by the old MAC), and re-applies that (found by the new one).
func TestApply(t *testing.T) {
	runInNewNetns(t, func() error {
		if _, err := LoopbackUp(); err != nil {
			return err
		}
		oldMAC, _ := net.ParseMAC("52:54:00:12:34:56")
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cubet0", HardwareAddr: oldMAC}, PeerName: "cubet1"}); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(mustLink(t, "cubet1")); err != nil {
			return err
		}
		first := mustParse(t, RawInterface{MAC: "52:54:00:12:34:56", MTU: 1400,
			Addresses: []string{"10.99.0.5/24", "fd00:99::5/64"},
			Routes:    []RawRoute{{Gateway: "10.99.0.1"}, {Destination: "10.100.0.0/16", Gateway: "10.99.0.2"}, {Gateway: "fd00:99::1"}, {Destination: "192.0.2.0/24"}}})
		res, err := Apply(first)
		if err != nil {
			return err
		}
		if len(res) != 1 || res[0].Name != "cubet0" || res[0].AddrsAdded != 2 || res[0].RoutesSet != 4 || res[0].MACChanged {
			t.Errorf("first apply: %+v", res)
		}
		want := state{mac: "52:54:00:12:34:56", mtu: 1400, up: true,
			addrs:  []string{"10.99.0.5/24", "fd00:99::5/64"},
			routes: []string{"0.0.0.0/0 via 10.99.0.1", "10.100.0.0/16 via 10.99.0.2", "192.0.2.0/24 via invalid IP", "::/0 via fd00:99::1"}}
		checkState(t, "first apply", linkState(t, "cubet0"), want)

		res, err = Apply(first)
		if err != nil {
			return err
		}
		if res[0].AddrsAdded != 0 || res[0].AddrsRemoved != 0 || res[0].RoutesGone != 0 {
			t.Errorf("re-apply changed addresses or removed routes: %+v", res[0])
		}
		checkState(t, "re-apply", linkState(t, "cubet0"), want)

		// A restored sandbox: the NIC still has the snapshot's MAC, the new pod another MAC and network.
		restored := mustParse(t, RawInterface{MAC: "02:42:0a:62:00:07", DeviceMAC: "52:54:00:12:34:56",
			Addresses: []string{"10.98.0.7/24"}, Routes: []RawRoute{{Gateway: "10.98.0.1"}}})
		for i := range 2 {
			res, err = Apply(restored)
			if err != nil {
				return err
			}
			if i == 0 && (!res[0].MACChanged || res[0].AddrsRemoved != 2) {
				// (RoutesGone is not checked: removing an address makes the kernel drop the routes through it.)
				t.Errorf("restore apply: %+v", res[0])
			}
			checkState(t, "restore apply", linkState(t, "cubet0"), state{mac: "02:42:0a:62:00:07", mtu: 1400, up: true,
				addrs: []string{"10.98.0.7/24"}, routes: []string{"0.0.0.0/0 via 10.98.0.1"}})
		}

		_, err = Apply(mustParse(t, RawInterface{MAC: "02:00:00:00:00:99"}))
		if !errors.Is(err, ErrNoInterface) {
			t.Errorf("unknown MAC: %v, want ErrNoInterface", err)
		}
		return nil
	})
}

func mustLink(t *testing.T, name string) netlink.Link {
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func checkState(t *testing.T, what string, got, want state) {
	t.Helper()
	if got.mac != want.mac || got.mtu != want.mtu || got.up != want.up || !slices.Equal(got.addrs, want.addrs) || !slices.Equal(got.routes, want.routes) {
		t.Errorf("%s: interface %+v, want %+v", what, got, want)
	}
}

func TestRouteKeyDefault(t *testing.T) {
	d, g := routeKey(nil, net.ParseIP("10.0.0.1"), unix.AF_INET)
	if d != netip.MustParsePrefix("0.0.0.0/0") || g != netip.MustParseAddr("10.0.0.1") {
		t.Errorf("default v4 key %s %s", d, g)
	}
	d, _ = routeKey(nil, nil, unix.AF_INET6)
	if d != netip.MustParsePrefix("::/0") {
		t.Errorf("default v6 key %s", d)
	}
}
