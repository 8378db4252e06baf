package fs

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// The FUSE wire format (include/uapi/linux/fuse.h, protocol 7.31), written
// out by byte offset: every request comes from guest memory and is parsed
// with explicit bounds checks, never by casting bytes onto a struct.

// Protocol version this server speaks.
const (
	KernelVersion      = 7
	KernelMinorVersion = 31
)

// Opcodes.
const (
	opLookup      = 1
	opForget      = 2
	opGetattr     = 3
	opSetattr     = 4
	opReadlink    = 5
	opSymlink     = 6
	opMknod       = 8
	opMkdir       = 9
	opUnlink      = 10
	opRmdir       = 11
	opRename      = 12
	opLink        = 13
	opOpen        = 14
	opRead        = 15
	opWrite       = 16
	opStatfs      = 17
	opRelease     = 18
	opFsync       = 20
	opFlush       = 25
	opInit        = 26
	opOpendir     = 27
	opReaddir     = 28
	opReleasedir  = 29
	opFsyncdir    = 30
	opAccess      = 34
	opCreate      = 35
	opInterrupt   = 36
	opDestroy     = 38
	opBatchForget = 42
	opReaddirplus = 44
	opRename2     = 45
)

// Struct sizes.
const (
	inHeaderLen   = 40
	outHeaderLen  = 16
	attrLen       = 88
	entryOutLen   = 40 + attrLen
	attrOutLen    = 16 + attrLen
	openOutLen    = 16
	writeOutLen   = 8
	statfsOutLen  = 80
	initOutLen    = 64
	direntBaseLen = 24
	forgetOneLen  = 16
)

// INIT flags this server may accept.
const (
	initAsyncRead  = 1 << 0
	initBigWrites  = 1 << 5
	initMaxPages   = 1 << 22
	initParallelOp = 1 << 18
)

// SETATTR valid bits.
const (
	fattrMode     = 1 << 0
	fattrUID      = 1 << 1
	fattrGID      = 1 << 2
	fattrSize     = 1 << 3
	fattrAtime    = 1 << 4
	fattrMtime    = 1 << 5
	fattrFh       = 1 << 6
	fattrAtimeNow = 1 << 7
	fattrMtimeNow = 1 << 8
)

const getattrFh = 1

// ErrMalformed marks a request that does not parse: shorter than its header
// says, a header length that lies, a body shorter than its opcode's struct,
// or a name that is not NUL-terminated.
var ErrMalformed = errors.New("malformed FUSE request")

// InHeader is struct fuse_in_header.
type InHeader struct {
	Len    uint32
	Opcode uint32
	Unique uint64
	NodeID uint64
	UID    uint32
	GID    uint32
	PID    uint32
}

// Request is one parsed request: its header and the body after it (exactly
// Len-40 bytes).
type Request struct {
	InHeader
	Body []byte
}

// ParseRequest parses a request buffer read from the guest. The header's
// length must be within the buffer and cover at least the header.
func ParseRequest(b []byte) (Request, error) {
	if len(b) < inHeaderLen {
		return Request{}, fmt.Errorf("%w: %d bytes, header needs %d", ErrMalformed, len(b), inHeaderLen)
	}
	le := binary.LittleEndian
	h := InHeader{
		Len: le.Uint32(b[0:]), Opcode: le.Uint32(b[4:]), Unique: le.Uint64(b[8:]),
		NodeID: le.Uint64(b[16:]), UID: le.Uint32(b[24:]), GID: le.Uint32(b[28:]), PID: le.Uint32(b[32:]),
	}
	if h.Len < inHeaderLen || uint64(h.Len) > uint64(len(b)) {
		return Request{}, fmt.Errorf("%w: header length %d, buffer %d", ErrMalformed, h.Len, len(b))
	}
	return Request{InHeader: h, Body: b[inHeaderLen:h.Len]}, nil
}

// body is a bounds-checked cursor over a request body.
type body struct {
	b   []byte
	err error
}

func (p *body) need(n int) []byte {
	if p.err != nil {
		return nil
	}
	if n < 0 || len(p.b) < n {
		p.err = fmt.Errorf("%w: body has %d bytes, want %d", ErrMalformed, len(p.b), n)
		return nil
	}
	out := p.b[:n]
	p.b = p.b[n:]
	return out
}

func (p *body) u32() uint32 {
	if b := p.need(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (p *body) u64() uint64 {
	if b := p.need(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (p *body) skip(n int) { p.need(n) }

// name reads a NUL-terminated string (at most limit bytes before the NUL).
func (p *body) name(limit int) string {
	if p.err != nil {
		return ""
	}
	i := bytes.IndexByte(p.b, 0)
	if i < 0 {
		p.err = fmt.Errorf("%w: string without NUL", ErrMalformed)
		return ""
	}
	if i > limit {
		p.err = fmt.Errorf("%w: string of %d bytes, limit %d", ErrMalformed, i, limit)
		return ""
	}
	s := string(p.b[:i])
	p.b = p.b[i+1:]
	return s
}

// rest returns what is left.
func (p *body) rest() []byte {
	r := p.b
	p.b = nil
	return r
}

// out builds a reply body.
type out struct{ b []byte }

func (o *out) u16(v uint16) { o.b = binary.LittleEndian.AppendUint16(o.b, v) }
func (o *out) u32(v uint32) { o.b = binary.LittleEndian.AppendUint32(o.b, v) }
func (o *out) u64(v uint64) { o.b = binary.LittleEndian.AppendUint64(o.b, v) }
func (o *out) pad(n int)    { o.b = append(o.b, make([]byte, n)...) }

// attr is struct fuse_attr.
type attr struct {
	Ino, Size, Blocks, Atime, Mtime, Ctime uint64
	AtimeNs, MtimeNs, CtimeNs              uint32
	Mode, Nlink, UID, GID, Rdev, Blksize   uint32
}

func (o *out) attr(a attr) {
	for _, v := range []uint64{a.Ino, a.Size, a.Blocks, a.Atime, a.Mtime, a.Ctime} {
		o.u64(v)
	}
	for _, v := range []uint32{a.AtimeNs, a.MtimeNs, a.CtimeNs, a.Mode, a.Nlink, a.UID, a.GID, a.Rdev, a.Blksize, 0} {
		o.u32(v)
	}
}

// entry is struct fuse_entry_out.
func (o *out) entry(nodeID uint64, a attr) {
	o.u64(nodeID)
	o.u64(0) // generation: node ids are never reused while the share is mounted
	o.u64(entryTimeout)
	o.u64(attrTimeout)
	o.u32(0)
	o.u32(0)
	o.attr(a)
}

// attrOut is struct fuse_attr_out.
func (o *out) attrOut(a attr) {
	o.u64(attrTimeout)
	o.u32(0)
	o.u32(0)
	o.attr(a)
}

// dirent appends struct fuse_dirent (padded to 8 bytes).
func (o *out) dirent(ino, off uint64, typ uint32, name string) {
	o.u64(ino)
	o.u64(off)
	o.u32(uint32(len(name)))
	o.u32(typ)
	o.b = append(o.b, name...)
	o.pad(direntPad(len(name)))
}

func direntSize(nameLen int) int { return direntBaseLen + nameLen + direntPad(nameLen) }
func direntPad(nameLen int) int  { return (8 - (direntBaseLen+nameLen)%8) % 8 }

// outHeader is struct fuse_out_header for a reply of bodyLen bytes.
func outHeader(unique uint64, errno int32, bodyLen int) []byte {
	var h [outHeaderLen]byte
	binary.LittleEndian.PutUint32(h[0:], uint32(outHeaderLen+bodyLen))
	binary.LittleEndian.PutUint32(h[4:], uint32(errno))
	binary.LittleEndian.PutUint64(h[8:], unique)
	return h[:]
}
