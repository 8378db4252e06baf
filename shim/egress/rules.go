package egress

import (
	"encoding/binary"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Actions a rule's counter reports.
const (
	ActionAllow      = "allow"       // AllowOut: accepted
	ActionDeny       = "deny"        // DenyOut: dropped
	ActionNoInternet = "no-internet" // AllowInternet false: dropped
	ActionNonIP      = "non-ip"      // neither ARP, IPv4 nor IPv6: dropped
	actionPass       = "pass"        // ARP, IPv4, IPv6 past the rules above: accepted, not reported
)

// Counter is one rule's count: the packets and bytes it matched since the
// policy was last set.
type Counter struct {
	Action string
	// CIDR is the destination the rule matches (0.0.0.0/0 and ::/0 for
	// no-internet; "" for non-ip).
	CIDR           string
	Packets, Bytes uint64
}

// tagPrefix starts every rule's user data: what the rule is, for reading
// its counter back.
const tagPrefix = "cube-egress:"

func tag(action, cidr string) []byte { return []byte(tagPrefix + action + " " + cidr) }

// parseTag undoes tag (ok false: not one of ours).
func parseTag(b []byte) (action, cidr string, ok bool) {
	s, ok := strings.CutPrefix(string(b), tagPrefix)
	if !ok {
		return "", "", false
	}
	action, cidr, ok = strings.Cut(s, " ")
	return action, cidr, ok
}

// Rules returns the chain's rules for p, in order (none for an open
// policy). Pure: the tests check the expressions.
func Rules(t *nftables.Table, c *nftables.Chain, p Policy) []*nftables.Rule {
	if p.IsOpen() {
		return nil
	}
	var rs []*nftables.Rule
	add := func(action, cidr string, exprs ...expr.Any) {
		rs = append(rs, &nftables.Rule{Table: t, Chain: c, Exprs: exprs, UserData: tag(action, cidr)})
	}
	for _, a := range p.AllowOut {
		add(ActionAllow, a.String(), matchDst(a, counted(expr.VerdictAccept)...)...)
	}
	for _, d := range p.DenyOut {
		add(ActionDeny, d.String(), matchDst(d, counted(expr.VerdictDrop)...)...)
	}
	if !p.AllowInternet {
		for _, all := range []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")} {
			add(ActionNoInternet, all.String(), matchDst(all, counted(expr.VerdictDrop)...)...)
		}
	}
	for _, proto := range []uint16{unix.ETH_P_ARP, unix.ETH_P_IP, unix.ETH_P_IPV6} {
		add(actionPass, "", append(matchProto(proto), &expr.Verdict{Kind: expr.VerdictAccept})...)
	}
	add(ActionNonIP, "", counted(expr.VerdictDrop)...)
	return rs
}

func counted(v expr.VerdictKind) []expr.Any {
	return []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: v}}
}

// matchProto loads the frame's ethertype (meta protocol) and compares it.
func matchProto(proto uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, proto)},
	}
}

// matchDst matches an IPv4 or IPv6 packet whose destination is in p (what
// `ip daddr 10.0.0.0/8` compiles to: the network header's destination
// field, masked, compared), then runs then.
func matchDst(p netip.Prefix, then ...expr.Any) []expr.Any {
	proto, off := uint16(unix.ETH_P_IP), uint32(16) // IPv4 header: daddr at 16
	if p.Addr().Is6() {
		proto, off = unix.ETH_P_IPV6, 24 // IPv6 header: daddr at 24
	}
	e := matchProto(proto)
	if p.Bits() > 0 {
		n := uint32(p.Addr().BitLen() / 8)
		e = append(e, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n})
		if p.Bits() < p.Addr().BitLen() {
			e = append(e, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: mask(p), Xor: make([]byte, n)})
		}
		e = append(e, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Addr().AsSlice()})
	}
	return append(e, then...)
}

// mask is p's netmask as bytes.
func mask(p netip.Prefix) []byte {
	m := make([]byte, p.Addr().BitLen()/8)
	for i := range p.Bits() {
		m[i/8] |= 0x80 >> (i % 8)
	}
	return m
}

// countersOf reads the counters of rules made by Rules.
func countersOf(rs []*nftables.Rule) []Counter {
	var out []Counter
	for _, r := range rs {
		action, cidr, ok := parseTag(r.UserData)
		if !ok || action == actionPass {
			continue
		}
		c := Counter{Action: action, CIDR: cidr}
		for _, e := range r.Exprs {
			if ce, ok := e.(*expr.Counter); ok {
				c.Packets, c.Bytes = ce.Packets, ce.Bytes
			}
		}
		out = append(out, c)
	}
	return out
}
