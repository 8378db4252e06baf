// Package egress is a sandbox's egress policy and its enforcement on the
// host, where the guest cannot touch it: an nftables table of the netdev
// family whose one chain hooks the ingress of the host's end of the
// sandbox's link (for a CNI pod: the host-side veth of the pod's interface,
// which every frame the VM sends crosses). Rules (github.com/google/nftables,
// no shell-outs), first match wins:
//
//  1. destination in AllowOut: accept (counted);
//  2. destination in DenyOut: drop (counted);
//  3. AllowInternet false: every other IPv4 and IPv6 packet: drop (counted);
//  4. when anything is restricted: ARP, IPv4 and IPv6 accepted, any other
//     frame (VLAN-tagged, other ethertypes that could carry IP past 1-3)
//     dropped (counted).
//
// An open policy (AllowInternet, no lists) has no table at all. A new policy
// replaces the chain's rules in one netlink batch (one nftables transaction:
// no packet sees half of it); Remove deletes the table.
//
// The filter is stateless (the netdev ingress hook precedes conntrack): a
// reply the sandbox sends to a peer it may not reach is dropped as well, so
// a server in a sandbox without internet access answers only clients whose
// addresses AllowOut names.
package egress

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
)

// MaxCIDRs bounds each of a policy's lists (every entry is one rule).
const MaxCIDRs = 256

// Policy is a sandbox's egress policy. The zero Policy denies internet
// access; Open() is the default.
type Policy struct {
	// AllowInternet false drops every IPv4 and IPv6 packet whose
	// destination AllowOut does not name.
	AllowInternet bool
	// AllowOut takes precedence over DenyOut: a destination in both is
	// allowed (DenyOut 0.0.0.0/0 with AllowOut exceptions is an allow list).
	AllowOut, DenyOut []netip.Prefix
}

// Open is the policy of a sandbox nobody restricted: everything allowed.
func Open() Policy { return Policy{AllowInternet: true} }

// IsOpen reports whether p restricts nothing (it needs no rules; AllowOut
// alone allows what is allowed anyway).
func (p Policy) IsOpen() bool { return p.AllowInternet && len(p.DenyOut) == 0 }

// Equal reports whether p and q are the same policy.
func (p Policy) Equal(q Policy) bool {
	return p.AllowInternet == q.AllowInternet && slices.Equal(p.AllowOut, q.AllowOut) && slices.Equal(p.DenyOut, q.DenyOut)
}

// String is the policy in the CLI's words.
func (p Policy) String() string {
	var b strings.Builder
	if p.AllowInternet {
		b.WriteString("internet allowed")
	} else {
		b.WriteString("internet denied")
	}
	if len(p.AllowOut) > 0 {
		fmt.Fprintf(&b, "; allow out %s", joinPrefixes(p.AllowOut))
	}
	if len(p.DenyOut) > 0 {
		fmt.Fprintf(&b, "; deny out %s", joinPrefixes(p.DenyOut))
	}
	return b.String()
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// Strings returns p's lists as Parse takes them.
func (p Policy) Strings() (allowOut, denyOut []string) {
	for _, a := range p.AllowOut {
		allowOut = append(allowOut, a.String())
	}
	for _, d := range p.DenyOut {
		denyOut = append(denyOut, d.String())
	}
	return allowOut, denyOut
}

// Parse builds a policy from user input: each CIDR ("10.0.0.0/8",
// "2001:db8::/32") or bare address (a /32 or /128). A bad entry is refused
// (errdefs.ErrInvalidArgument) naming its field and index, e.g.
// "allow_out[1]". Host bits are cleared (10.1.2.3/8 is 10.0.0.0/8);
// duplicates are dropped; an IPv4-mapped IPv6 address is refused (it would
// never match an IPv4 packet).
func Parse(allowInternet bool, allowOut, denyOut []string) (Policy, error) {
	p := Policy{AllowInternet: allowInternet}
	var err error
	if p.AllowOut, err = parseList("allow_out", allowOut); err != nil {
		return Policy{}, err
	}
	if p.DenyOut, err = parseList("deny_out", denyOut); err != nil {
		return Policy{}, err
	}
	return p, nil
}

func parseList(field string, in []string) ([]netip.Prefix, error) {
	if len(in) > MaxCIDRs {
		return nil, fmt.Errorf("%s: %d entries, at most %d: %w", field, len(in), MaxCIDRs, errdefs.ErrInvalidArgument)
	}
	var out []netip.Prefix
	for i, s := range in {
		p, err := ParseCIDR(s)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", field, i, err)
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// ParseCIDR parses one CIDR or bare address of a policy list.
func ParseCIDR(s string) (netip.Prefix, error) {
	bad := func(why string) (netip.Prefix, error) {
		return netip.Prefix{}, fmt.Errorf("%.64q %s (want a CIDR such as 10.0.0.0/8 or 2001:db8::/32, or an address): %w", s, why, errdefs.ErrInvalidArgument)
	}
	if s == "" || len(s) > 64 {
		return bad("is empty or too long")
	}
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return bad("does not parse")
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return bad("does not parse")
		}
		if a.Zone() != "" {
			return bad("has a zone")
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if p.Addr().Is4In6() {
		return bad("is an IPv4-mapped IPv6 address (write the IPv4 form)")
	}
	return p.Masked(), nil
}
