package fs

import (
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"
)

// client drives a Server with byte buffers, as the guest's FUSE driver would.
type client struct {
	t      testing.TB
	s      *Server
	unique uint64
	uid    uint32
}

func newClient(t testing.TB, dir string, ro bool) *client {
	t.Helper()
	s, err := NewServer(dir, ro)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c := &client{t: t, s: s}
	var in out
	in.u32(7)
	in.u32(38)
	in.u32(128 << 10)
	in.u32(initBigWrites | initMaxPages | 1<<13)
	in.pad(48)
	b, e := c.call(opInit, rootID, in.b)
	if e != 0 || len(b) != initOutLen || binary.LittleEndian.Uint32(b) != 7 {
		t.Fatalf("INIT: errno %v, %d bytes", e, len(b))
	}
	return c
}

// request encodes a request.
func request(op uint32, node, unique uint64, uid uint32, body []byte) []byte {
	var o out
	o.u32(uint32(inHeaderLen + len(body)))
	o.u32(op)
	o.u64(unique)
	o.u64(node)
	o.u32(uid)
	o.u32(uid)
	o.u32(1)
	o.u32(0)
	return append(o.b, body...)
}

// call sends a request and returns the reply body and errno.
func (c *client) call(op uint32, node uint64, body []byte) ([]byte, unix.Errno) {
	c.t.Helper()
	c.unique++
	reply := c.s.Handle(request(op, node, c.unique, c.uid, body), 1<<20)
	if len(reply) < outHeaderLen {
		c.t.Fatalf("op %d: reply of %d bytes", op, len(reply))
	}
	if l := binary.LittleEndian.Uint32(reply); int(l) != len(reply) {
		c.t.Fatalf("op %d: out header length %d, reply %d", op, l, len(reply))
	}
	if u := binary.LittleEndian.Uint64(reply[8:]); u != c.unique {
		c.t.Fatalf("op %d: unique %d, want %d", op, u, c.unique)
	}
	errno := -int32(binary.LittleEndian.Uint32(reply[4:]))
	return reply[outHeaderLen:], unix.Errno(errno)
}

func cstr(names ...string) []byte {
	var b []byte
	for _, n := range names {
		b = append(append(b, n...), 0)
	}
	return b
}

// lookup returns the node id and mode of name under parent.
func (c *client) lookup(parent uint64, name string) (uint64, uint32, unix.Errno) {
	b, e := c.call(opLookup, parent, cstr(name))
	if e != 0 {
		return 0, 0, e
	}
	return binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint32(b[40+60:]), 0
}

func (c *client) mustLookup(parent uint64, name string) uint64 {
	c.t.Helper()
	id, _, e := c.lookup(parent, name)
	if e != 0 {
		c.t.Fatalf("LOOKUP %q: %v", name, e)
	}
	return id
}

func (c *client) open(node uint64, flags uint32) (uint64, unix.Errno) {
	var in out
	in.u32(flags)
	in.u32(0)
	b, e := c.call(opOpen, node, in.b)
	if e != 0 {
		return 0, e
	}
	return binary.LittleEndian.Uint64(b), 0
}

func (c *client) create(parent uint64, name string, flags, mode uint32) (node, fh uint64, e unix.Errno) {
	var in out
	in.u32(flags)
	in.u32(mode)
	in.u32(0)
	in.u32(0)
	b, e := c.call(opCreate, parent, append(in.b, cstr(name)...))
	if e != 0 {
		return 0, 0, e
	}
	return binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[entryOutLen:]), 0
}

func ioBody(fh, off uint64, size uint32) []byte {
	var in out
	in.u64(fh)
	in.u64(off)
	in.u32(size)
	in.pad(20)
	return in.b
}

func (c *client) write(node, fh, off uint64, data []byte) (uint32, unix.Errno) {
	b, e := c.call(opWrite, node, append(ioBody(fh, off, uint32(len(data))), data...))
	if e != 0 {
		return 0, e
	}
	return binary.LittleEndian.Uint32(b), 0
}

func (c *client) read(node, fh, off uint64, size uint32) ([]byte, unix.Errno) {
	return c.call(opRead, node, ioBody(fh, off, size))
}

func (c *client) release(node, fh uint64, dir bool) unix.Errno {
	var in out
	in.u64(fh)
	in.pad(16)
	op := uint32(opRelease)
	if dir {
		op = opReleasedir
	}
	_, e := c.call(op, node, in.b)
	return e
}

// readdir lists a directory through OPENDIR/READDIR(PLUS)/RELEASEDIR in
// small pieces (so offsets are exercised).
func (c *client) readdir(node uint64, plus bool) map[string]uint64 {
	c.t.Helper()
	var in out
	in.u32(0)
	in.u32(0)
	b, e := c.call(opOpendir, node, in.b)
	if e != 0 {
		c.t.Fatalf("OPENDIR: %v", e)
	}
	fh := binary.LittleEndian.Uint64(b)
	names := map[string]uint64{}
	op := uint32(opReaddir)
	if plus {
		op = opReaddirplus
	}
	for off := uint64(0); ; {
		b, e := c.call(op, node, ioBody(fh, off, 200))
		if e != 0 {
			c.t.Fatalf("READDIR: %v", e)
		}
		if len(b) == 0 {
			break
		}
		for len(b) > 0 {
			var id uint64
			if plus {
				id = binary.LittleEndian.Uint64(b)
				b = b[entryOutLen:]
			}
			nl := int(binary.LittleEndian.Uint32(b[16:]))
			off = binary.LittleEndian.Uint64(b[8:])
			names[string(b[24:24+nl])] = id
			b = b[direntSize(nl):]
		}
	}
	if e := c.release(node, fh, true); e != 0 {
		c.t.Fatalf("RELEASEDIR: %v", e)
	}
	return names
}
