package egress

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

func TestParse(t *testing.T) {
	p, err := Parse(false, []string{"10.1.2.3/8", "192.0.2.7", "10.0.0.0/8", "2001:db8::1/32"}, []string{"0.0.0.0/0"})
	if err != nil {
		t.Fatal(err)
	}
	want := Policy{AllowOut: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32"),
		netip.MustParsePrefix("2001:db8::/32")}, DenyOut: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}
	if !p.Equal(want) {
		t.Errorf("parsed %v, want %v", p, want)
	}
	if got := p.String(); got != "internet denied; allow out 10.0.0.0/8,192.0.2.7/32,2001:db8::/32; deny out 0.0.0.0/0" {
		t.Errorf("String: %q", got)
	}
	for _, c := range []struct {
		allow, deny []string
		field       string
	}{
		{[]string{"10.0.0.0/8", "10.0.0.300/8"}, nil, "allow_out[1]"},
		{nil, []string{"not-a-cidr"}, "deny_out[0]"},
		{nil, []string{""}, "deny_out[0]"},
		{[]string{"10.0.0.0/33"}, nil, "allow_out[0]"},
		{[]string{"fe80::1%eth0"}, nil, "allow_out[0]"},
		{[]string{"::ffff:10.0.0.1"}, nil, "allow_out[0]"},
		{nil, make([]string, MaxCIDRs+1), "deny_out:"},
	} {
		_, err := Parse(true, c.allow, c.deny)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.HasPrefix(err.Error(), c.field) {
			t.Errorf("Parse(%q, %q): %v, want an invalid-argument error naming %s", c.allow, c.deny, err, c.field)
		}
	}
	if !Open().IsOpen() || (Policy{AllowInternet: true, AllowOut: want.AllowOut}).IsOpen() != true || (Policy{}).IsOpen() {
		t.Error("IsOpen")
	}
}

func TestRules(t *testing.T) {
	tb := &nftables.Table{Name: "t", Family: nftables.TableFamilyNetdev}
	ch := &nftables.Chain{Name: ChainName, Table: tb}
	if rs := Rules(tb, ch, Open()); rs != nil {
		t.Errorf("open policy: %d rules, want none", len(rs))
	}
	p, _ := Parse(false, []string{"10.88.0.1", "2001:db8::/33"}, []string{"10.0.0.0/12"})
	rs := Rules(tb, ch, p)
	ip4, ip6, arp := []byte{0x08, 0x00}, []byte{0x86, 0xdd}, []byte{0x08, 0x06}
	proto := func(b []byte) []expr.Any {
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b}}
	}
	cat := func(es ...[]expr.Any) []expr.Any {
		var out []expr.Any
		for _, e := range es {
			out = append(out, e...)
		}
		return out
	}
	load := func(off, n uint32) []expr.Any {
		return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n}}
	}
	masked := func(m []byte) []expr.Any {
		return []expr.Any{&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: uint32(len(m)), Mask: m, Xor: make([]byte, len(m))}}
	}
	eq := func(b ...byte) []expr.Any { return []expr.Any{&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b}} }
	accept := []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept}}
	drop := []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}
	v6mask := make([]byte, 16)
	v6mask[0], v6mask[1], v6mask[2], v6mask[3], v6mask[4] = 0xff, 0xff, 0xff, 0xff, 0x80
	want := []struct {
		tag   string
		exprs []expr.Any
	}{
		// ip daddr 10.88.0.1 counter accept: a /32 needs no mask
		{"allow 10.88.0.1/32", cat(proto(ip4), load(16, 4), eq(10, 88, 0, 1), accept)},
		// ip6 daddr 2001:db8::/33 counter accept
		{"allow 2001:db8::/33", cat(proto(ip6), load(24, 16), masked(v6mask), eq(0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), accept)},
		// ip daddr 10.0.0.0/12 counter drop
		{"deny 10.0.0.0/12", cat(proto(ip4), load(16, 4), masked([]byte{255, 240, 0, 0}), eq(10, 0, 0, 0), drop)},
		{"no-internet 0.0.0.0/0", cat(proto(ip4), drop)},
		{"no-internet ::/0", cat(proto(ip6), drop)},
		{"pass ", cat(proto(arp), []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}})},
		{"pass ", cat(proto(ip4), []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}})},
		{"pass ", cat(proto(ip6), []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}})},
		{"non-ip ", drop},
	}
	if len(rs) != len(want) {
		t.Fatalf("%d rules, want %d", len(rs), len(want))
	}
	for i, w := range want {
		r := rs[i]
		if r.Table != tb || r.Chain != ch {
			t.Errorf("rule %d: not in the table's chain", i)
		}
		if string(r.UserData) != tagPrefix+w.tag {
			t.Errorf("rule %d: tag %q, want %q", i, r.UserData, tagPrefix+w.tag)
		}
		if !reflect.DeepEqual(r.Exprs, w.exprs) {
			t.Errorf("rule %d (%s): expressions\n%#v\nwant\n%#v", i, w.tag, r.Exprs, w.exprs)
		}
	}

	// Internet allowed, a deny list: no catch-all drop of IP.
	p, _ = Parse(true, nil, []string{"192.0.2.0/24"})
	rs = Rules(tb, ch, p)
	var tags []string
	for _, r := range rs {
		tags = append(tags, strings.TrimPrefix(string(r.UserData), tagPrefix))
	}
	if got := strings.Join(tags, "|"); got != "deny 192.0.2.0/24|pass |pass |pass |non-ip " {
		t.Errorf("rules of %v: %s", p, got)
	}
}

func TestCountersOf(t *testing.T) {
	rs := []*nftables.Rule{
		{UserData: tag(ActionAllow, "10.0.0.0/8"), Exprs: []expr.Any{&expr.Counter{Packets: 3, Bytes: 180}, &expr.Verdict{Kind: expr.VerdictAccept}}},
		{UserData: tag(actionPass, ""), Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}},
		{UserData: []byte("someone else's"), Exprs: []expr.Any{&expr.Counter{Packets: 9}}},
		{UserData: tag(ActionNonIP, ""), Exprs: []expr.Any{&expr.Counter{Packets: 1, Bytes: 60}}},
	}
	got := countersOf(rs)
	want := []Counter{{Action: ActionAllow, CIDR: "10.0.0.0/8", Packets: 3, Bytes: 180}, {Action: ActionNonIP, Packets: 1, Bytes: 60}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("counters %+v, want %+v", got, want)
	}
}

// FuzzParseCIDR: user input from the shim's ttrpc API and the CLI.
func FuzzParseCIDR(f *testing.F) {
	for _, s := range []string{"10.0.0.0/8", "192.0.2.1", "::/0", "2001:db8::/129", "1.2.3.4/", "fe80::1%x/64", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseCIDR(s)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("%q: %v is not an invalid-argument error", s, err)
			}
			return
		}
		if p != p.Masked() || !p.IsValid() {
			t.Fatalf("%q: %v not a valid masked prefix", s, p)
		}
		// The rule it makes matches the right header field.
		e := matchDst(p)
		if len(e) < 2 || (p.Bits() > 0 && len(e) < 4) {
			t.Fatalf("%q: %d expressions", s, len(e))
		}
	})
}
