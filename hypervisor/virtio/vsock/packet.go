package vsock

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Packet header (struct virtio_vsock_hdr, 44 bytes little endian).
const HeaderLen = 44

// Operations.
const (
	OpInvalid       = 0
	OpRequest       = 1
	OpResponse      = 2
	OpRst           = 3
	OpShutdown      = 4
	OpRW            = 5
	OpCreditUpdate  = 6
	OpCreditRequest = 7
)

// Shutdown flags: the sender will not receive / will not send any more.
const (
	ShutdownRcv  = 1
	ShutdownSend = 2
)

// TypeStream is the only socket type served (SOCK_STREAM).
const TypeStream = 1

// Header is a parsed virtio_vsock_hdr.
type Header struct {
	SrcCID   uint64
	DstCID   uint64
	SrcPort  uint32
	DstPort  uint32
	Len      uint32
	Type     uint16
	Op       uint16
	Flags    uint32
	BufAlloc uint32
	FwdCnt   uint32
}

// ParseHeader decodes a header; b must hold at least HeaderLen bytes.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderLen {
		return Header{}, fmt.Errorf("vsock header: %d bytes, want %d", len(b), HeaderLen)
	}
	le := binary.LittleEndian
	return Header{
		SrcCID: le.Uint64(b[0:]), DstCID: le.Uint64(b[8:]),
		SrcPort: le.Uint32(b[16:]), DstPort: le.Uint32(b[20:]),
		Len: le.Uint32(b[24:]), Type: le.Uint16(b[28:]), Op: le.Uint16(b[30:]),
		Flags: le.Uint32(b[32:]), BufAlloc: le.Uint32(b[36:]), FwdCnt: le.Uint32(b[40:]),
	}, nil
}

// Encode writes the header into b (at least HeaderLen bytes).
func (h Header) Encode(b []byte) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], h.SrcCID)
	le.PutUint64(b[8:], h.DstCID)
	le.PutUint32(b[16:], h.SrcPort)
	le.PutUint32(b[20:], h.DstPort)
	le.PutUint32(b[24:], h.Len)
	le.PutUint16(b[28:], h.Type)
	le.PutUint16(b[30:], h.Op)
	le.PutUint32(b[32:], h.Flags)
	le.PutUint32(b[36:], h.BufAlloc)
	le.PutUint32(b[40:], h.FwdCnt)
}

// maxHandshake bounds the host's CONNECT line.
const maxHandshake = 32

// ParseConnect parses the hybrid-vsock handshake line "CONNECT <port>" (without
// the newline).
func ParseConnect(line string) (uint32, error) {
	rest, ok := strings.CutPrefix(line, "CONNECT ")
	if !ok {
		return 0, errors.New("handshake does not start with \"CONNECT \"")
	}
	rest = strings.TrimSuffix(rest, "\r")
	if rest == "" || len(rest) > 10 {
		return 0, fmt.Errorf("bad port %q", rest)
	}
	p, err := strconv.ParseUint(rest, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("bad port %q: %w", rest, err)
	}
	return uint32(p), nil
}
