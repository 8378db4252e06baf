package net

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
)

// Device feature bits (virtio 1.x, 5.1.3).
const (
	FCsum      = 1 << 0  // the driver may hand us frames with a partial checksum (tx)
	FGuestCsum = 1 << 1  // we may hand the driver frames with a partial checksum (rx)
	FMAC       = 1 << 5  // config space has the MAC
	FGuestTSO4 = 1 << 7  // rx: TCP/IPv4 segmentation offload frames
	FGuestTSO6 = 1 << 8  // rx: TCP/IPv6
	FGuestECN  = 1 << 9  // rx: TSO frames with ECN
	FGuestUFO  = 1 << 10 // never offered
	FHostTSO4  = 1 << 11 // tx: TCP/IPv4 segmentation offload frames
	FHostTSO6  = 1 << 12 // tx: TCP/IPv6
	FHostECN   = 1 << 13 // tx: TSO frames with ECN
	FHostUFO   = 1 << 14 // never offered
	FMrgRxbuf  = 1 << 15 // a received frame may span several rx chains (num_buffers)
	FStatus    = 1 << 16 // config space has the link status
)

// Header flags and GSO types (struct virtio_net_hdr_v1).
const (
	HdrFNeedsCsum = 1
	HdrFDataValid = 2

	GSONone  = 0
	GSOTCPv4 = 1
	GSOUDP   = 3
	GSOTCPv6 = 4
	GSOECN   = 0x80
)

// HeaderLen is the size of struct virtio_net_hdr_v1, which precedes every
// frame both ways (VIRTIO_F_VERSION_1 makes it 12 bytes with or without
// MRG_RXBUF); the tap is configured for the same size (TUNSETVNETHDRSZ).
const HeaderLen = 12

// MaxPacket bounds a frame after the header: a 64 KiB IP packet (the
// largest a TSO frame carries) plus an Ethernet header with a VLAN tag.
const MaxPacket = 65535 + 14 + 4

// MinPacket is an Ethernet header: anything shorter is not a frame.
const MinPacket = 14

// TUN offload flags (TUNSETOFFLOAD, <linux/if_tun.h>): what the host may
// hand the tap's reader (our rx), as agreed with the guest.
const (
	TunFCsum   = 0x01
	TunFTSO4   = 0x02
	TunFTSO6   = 0x04
	TunFTSOECN = 0x08
)

// Header is struct virtio_net_hdr_v1.
type Header struct {
	Flags      uint8
	GSOType    uint8
	HdrLen     uint16
	GSOSize    uint16
	CsumStart  uint16
	CsumOffset uint16
	NumBuffers uint16
}

// ParseHeader decodes the first HeaderLen bytes of b.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderLen {
		return Header{}, fmt.Errorf("virtio-net header of %d bytes, want %d", len(b), HeaderLen)
	}
	le := binary.LittleEndian
	return Header{
		Flags: b[0], GSOType: b[1], HdrLen: le.Uint16(b[2:]), GSOSize: le.Uint16(b[4:]),
		CsumStart: le.Uint16(b[6:]), CsumOffset: le.Uint16(b[8:]), NumBuffers: le.Uint16(b[10:]),
	}, nil
}

// Encode writes h into the first HeaderLen bytes of b.
func (h Header) Encode(b []byte) {
	le := binary.LittleEndian
	b[0], b[1] = h.Flags, h.GSOType
	le.PutUint16(b[2:], h.HdrLen)
	le.PutUint16(b[4:], h.GSOSize)
	le.PutUint16(b[6:], h.CsumStart)
	le.PutUint16(b[8:], h.CsumOffset)
	le.PutUint16(b[10:], h.NumBuffers)
}

// Errors of header checks (the frame is dropped and counted).
var (
	ErrHeader = errors.New("virtio-net header not allowed by the negotiated features")
	ErrFrame  = errors.New("virtio-net frame length out of range")
)

// checkGSO checks a GSO type against the features that allow each kind
// (tso4, tso6, ecn: the negotiated host or guest bits).
func checkGSO(h Header, features uint64, tso4, tso6, ecn uint64) error {
	base := h.GSOType &^ GSOECN
	if base == GSONone {
		if h.GSOType != GSONone {
			return fmt.Errorf("%w: ECN bit without GSO", ErrHeader)
		}
		return nil
	}
	switch {
	case base == GSOTCPv4 && features&tso4 != 0:
	case base == GSOTCPv6 && features&tso6 != 0:
	default:
		return fmt.Errorf("%w: gso type %#x", ErrHeader, h.GSOType)
	}
	if h.GSOType&GSOECN != 0 && features&ecn == 0 {
		return fmt.Errorf("%w: gso ECN", ErrHeader)
	}
	if h.GSOSize == 0 {
		return fmt.Errorf("%w: gso without a segment size", ErrHeader)
	}
	if h.Flags&HdrFNeedsCsum == 0 {
		return fmt.Errorf("%w: gso without NEEDS_CSUM", ErrHeader)
	}
	return nil
}

// CheckTx checks the header of a frame the guest sends (packet bytes after
// the header) against the negotiated features and returns the header to
// hand the tap: DATA_VALID and other flags a driver must not set are
// cleared, num_buffers is zero.
func CheckTx(h Header, packet int, features uint64) (Header, error) {
	if packet < MinPacket || packet > MaxPacket {
		return h, fmt.Errorf("%w: %d bytes", ErrFrame, packet)
	}
	h.Flags &= HdrFNeedsCsum
	h.NumBuffers = 0
	if h.Flags&HdrFNeedsCsum != 0 {
		if features&FCsum == 0 {
			return h, fmt.Errorf("%w: NEEDS_CSUM without VIRTIO_NET_F_CSUM", ErrHeader)
		}
		if int(h.CsumStart)+int(h.CsumOffset)+2 > packet {
			return h, fmt.Errorf("%w: checksum at %d+%d beyond the %d-byte frame", ErrHeader, h.CsumStart, h.CsumOffset, packet)
		}
	}
	if features&FCsum == 0 && h.GSOType != GSONone {
		return h, fmt.Errorf("%w: gso without VIRTIO_NET_F_CSUM", ErrHeader)
	}
	return h, checkGSO(h, features, FHostTSO4, FHostTSO6, FHostECN)
}

// CheckRx checks the header of a frame the backend received (packet bytes
// after the header) against what the guest negotiated and returns the header
// to give the guest with num_buffers set to n. Without GUEST_CSUM the flags
// must be zero (a DATA_VALID hint is cleared; a partial checksum the guest
// cannot finish drops the frame).
func CheckRx(h Header, packet int, features uint64, n uint16) (Header, error) {
	if packet < MinPacket || packet > MaxPacket {
		return h, fmt.Errorf("%w: %d bytes", ErrFrame, packet)
	}
	h.NumBuffers = n
	if features&FGuestCsum == 0 {
		if h.Flags&HdrFNeedsCsum != 0 || h.GSOType != GSONone {
			return h, fmt.Errorf("%w: offloaded frame for a guest without GUEST_CSUM", ErrHeader)
		}
		h.Flags = 0
		return h, nil
	}
	h.Flags &= HdrFNeedsCsum | HdrFDataValid
	if h.Flags&HdrFNeedsCsum != 0 && int(h.CsumStart)+int(h.CsumOffset)+2 > packet {
		return h, fmt.Errorf("%w: checksum at %d+%d beyond the %d-byte frame", ErrHeader, h.CsumStart, h.CsumOffset, packet)
	}
	return h, checkGSO(h, features, FGuestTSO4, FGuestTSO6, FGuestECN)
}

// TunOffloads maps negotiated features to the TUN_F_* flags the tap gets:
// what the guest accepts on rx. TSO needs the checksum offload under it
// (the spec's dependency, and the tap refuses TSO without TUN_F_CSUM).
func TunOffloads(features uint64) uint32 {
	if features&FGuestCsum == 0 {
		return 0
	}
	f := uint32(TunFCsum)
	if features&FGuestTSO4 != 0 {
		f |= TunFTSO4
	}
	if features&FGuestTSO6 != 0 {
		f |= TunFTSO6
	}
	if features&FGuestECN != 0 && f&(TunFTSO4|TunFTSO6) != 0 {
		f |= TunFTSOECN
	}
	return f
}

// guestFeatures are the rx offload features a backend's TUN_F_* support allows.
func guestFeatures(tun uint32) uint64 {
	if tun&TunFCsum == 0 {
		return 0
	}
	f := uint64(FGuestCsum)
	if tun&TunFTSO4 != 0 {
		f |= FGuestTSO4
	}
	if tun&TunFTSO6 != 0 {
		f |= FGuestTSO6
	}
	if tun&TunFTSOECN != 0 && tun&(TunFTSO4|TunFTSO6) != 0 {
		f |= FGuestECN
	}
	return f
}

// MAC is an Ethernet address.
type MAC [6]byte

func (m MAC) String() string {
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5])
}

// ParseMAC reads exactly six two-digit hex octets separated by colons and
// refuses what a NIC cannot have: a multicast (or broadcast) or all-zero address.
func ParseMAC(s string) (MAC, error) {
	var m MAC
	if len(s) != 17 {
		return m, fmt.Errorf("mac %q: want six hex octets XX:XX:XX:XX:XX:XX", s)
	}
	for i := range m {
		if i > 0 && s[3*i-1] != ':' {
			return m, fmt.Errorf("mac %q: want six hex octets XX:XX:XX:XX:XX:XX", s)
		}
		hi, ok1 := unhex(s[3*i])
		lo, ok2 := unhex(s[3*i+1])
		if !ok1 || !ok2 {
			return m, fmt.Errorf("mac %q: %q is not a hex octet", s, s[3*i:3*i+2])
		}
		m[i] = hi<<4 | lo
	}
	return m, m.check()
}

func (m MAC) check() error {
	if m == (MAC{}) {
		return fmt.Errorf("mac %s: all zero", m)
	}
	if m[0]&1 != 0 {
		return fmt.Errorf("mac %s: a multicast address (low bit of the first octet set)", m)
	}
	return nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// RandomMAC returns a random locally administered unicast address.
func RandomMAC() MAC {
	var m MAC
	_, _ = rand.Read(m[:])
	m[0] = m[0]&^1 | 2
	return m
}
