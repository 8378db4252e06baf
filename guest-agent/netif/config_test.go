package netif

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestParseGood(t *testing.T) {
	c, err := Parse([]RawInterface{{
		MAC: "02:42:0a:58:00:05", DeviceMAC: "52:54:00:12:34:56", Name: "eth0", MTU: 1450,
		Addresses: []string{"10.88.0.5/16", "fd00::5/64"},
		Routes: []RawRoute{{Gateway: "10.88.0.1"}, {Destination: "10.99.1.7/16", Gateway: "10.88.0.2"},
			{Destination: "169.254.1.1/32"}, {Gateway: "fd00::1"}},
	}}, &RawDNS{Nameservers: []string{"10.96.0.10", "fd00::a"}, Search: []string{"default.svc.cluster.local", "svc.cluster.local"}, Options: []string{"ndots:5"}})
	if err != nil {
		t.Fatal(err)
	}
	in := c.Interfaces[0]
	if in.MAC.String() != "02:42:0a:58:00:05" || in.DeviceMAC.String() != "52:54:00:12:34:56" || in.MTU != 1450 || len(in.Addrs) != 2 {
		t.Errorf("interface %+v", in)
	}
	if r := in.Routes[1]; r.Dst.String() != "10.99.0.0/16" {
		t.Errorf("route destination not masked: %s", r.Dst)
	}
	if !in.Routes[0].Is4() || in.Routes[3].Is4() {
		t.Errorf("default route families: %+v", in.Routes)
	}
	want := "search default.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\nnameserver fd00::a\noptions ndots:5\n"
	if got := string(c.DNS.ResolvConf()); !strings.HasSuffix(got, want) || !strings.HasPrefix(got, "#") {
		t.Errorf("resolv.conf:\n%s\nwant (after a comment):\n%s", got, want)
	}
	// device_mac equal to mac means "no change".
	c, err = Parse([]RawInterface{{MAC: "02:00:00:00:00:01", DeviceMAC: "02:00:00:00:00:01"}}, nil)
	if err != nil || c.Interfaces[0].DeviceMAC != nil || c.DNS != nil {
		t.Errorf("device_mac == mac: %+v %v", c, err)
	}
}

func TestParseRefusals(t *testing.T) {
	ok := RawInterface{MAC: "02:00:00:00:00:01"}
	many := func(n int, f func(i int) string) []string {
		var s []string
		for i := 0; i < n; i++ {
			s = append(s, f(i))
		}
		return s
	}
	cases := []struct {
		name string
		ifs  []RawInterface
		dns  *RawDNS
		want string
	}{
		{"bad mac", []RawInterface{{MAC: "02:00:00:00:00"}}, nil, "interfaces[0]: mac"},
		{"mac with dashes", []RawInterface{{MAC: "02-00-00-00-00-01"}}, nil, "interfaces[0]: mac"},
		{"long mac", []RawInterface{{MAC: "02:00:00:00:00:00:00:01"}}, nil, "interfaces[0]: mac"},
		{"multicast mac", []RawInterface{{MAC: "01:00:5e:00:00:01"}}, nil, "multicast"},
		{"zero mac", []RawInterface{{MAC: "00:00:00:00:00:00"}}, nil, "all-zero"},
		{"bad device mac", []RawInterface{{MAC: "02:00:00:00:00:01", DeviceMAC: "x"}}, nil, "device_mac"},
		{"duplicate mac", []RawInterface{ok, ok}, nil, "interfaces[1]: mac 02:00:00:00:00:01 already names interfaces[0]"},
		{"mtu low", []RawInterface{{MAC: ok.MAC, MTU: 67}}, nil, "mtu 67"},
		{"mtu high", []RawInterface{{MAC: ok.MAC, MTU: 65536}}, nil, "mtu 65536"},
		{"name", []RawInterface{{MAC: ok.MAC, Name: "a/b"}}, nil, "name"},
		{"address no prefix", []RawInterface{{MAC: ok.MAC, Addresses: []string{"10.0.0.1"}}}, nil, "addresses[0]"},
		{"address zone", []RawInterface{{MAC: ok.MAC, Addresses: []string{"fe80::1%eth0/64"}}}, nil, "addresses[0]"},
		{"address loopback", []RawInterface{{MAC: ok.MAC, Addresses: []string{"127.0.0.2/8"}}}, nil, "addresses[0]"},
		{"address multicast", []RawInterface{{MAC: ok.MAC, Addresses: []string{"224.0.0.1/4"}}}, nil, "addresses[0]"},
		{"too many addresses", []RawInterface{{MAC: ok.MAC, Addresses: many(17, func(i int) string { return fmt.Sprintf("10.0.0.%d/24", i+1) })}}, nil, "17 addresses"},
		{"default without gateway", []RawInterface{{MAC: ok.MAC, Routes: []RawRoute{{}}}}, nil, "routes[0]: "},
		{"bad gateway", []RawInterface{{MAC: ok.MAC, Routes: []RawRoute{{Gateway: "10.0.0"}}}}, nil, "routes[0]: "},
		{"bad destination", []RawInterface{{MAC: ok.MAC, Routes: []RawRoute{{Destination: "10.0.0.0", Gateway: "10.0.0.1"}}}}, nil, "destination"},
		{"mixed families", []RawInterface{{MAC: ok.MAC, Routes: []RawRoute{{Destination: "fd00::/8", Gateway: "10.0.0.1"}}}}, nil, "families"},
		{"too many routes", []RawInterface{{MAC: ok.MAC, Routes: make([]RawRoute, 65)}}, nil, "65 routes"},
		{"too many interfaces", make([]RawInterface, 9), nil, "9 interfaces"},
		{"bad nameserver", nil, &RawDNS{Nameservers: []string{"dns.example"}}, "dns: "},
		{"too many nameservers", nil, &RawDNS{Nameservers: many(9, func(i int) string { return fmt.Sprintf("10.0.0.%d", i+1) })}, "9 nameservers"},
		{"search with space", nil, &RawDNS{Search: []string{"a b"}}, "search[0]"},
		{"option with newline", nil, &RawDNS{Options: []string{"ndots:5\nnameserver 1.2.3.4"}}, "options[0]"},
		{"empty search", nil, &RawDNS{Search: []string{""}}, "search[0]"},
		{"long search", nil, &RawDNS{Search: []string{strings.Repeat("a", 254)}}, "search[0]"},
		{"too many search", nil, &RawDNS{Search: many(33, func(int) string { return "a" })}, "33 search"},
	}
	for _, c := range cases {
		_, err := Parse(c.ifs, c.dns)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrInvalid naming %q", c.name, err, c.want)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add("02:00:00:00:00:01", "", uint32(1500), "10.0.0.2/24", "", "10.0.0.1", "10.0.0.1", "svc", "ndots:5")
	f.Fuzz(func(t *testing.T, mac, dmac string, mtu uint32, addr, dst, gw, ns, search, opt string) {
		c, err := Parse([]RawInterface{{MAC: mac, DeviceMAC: dmac, MTU: mtu, Addresses: []string{addr}, Routes: []RawRoute{{Destination: dst, Gateway: gw}}}},
			&RawDNS{Nameservers: []string{ns}, Search: []string{search}, Options: []string{opt}})
		if err != nil {
			return
		}
		// Whatever passed renders as exactly the lines resolv.conf expects.
		if n := strings.Count(string(c.DNS.ResolvConf()), "\n"); n != 4 {
			t.Fatalf("resolv.conf of %q %q %q has %d lines", ns, search, opt, n)
		}
	})
}
