package fs

import (
	"encoding/binary"
	"math"

	"golang.org/x/sys/unix"
)

// openFlags keeps the open(2) flags a guest may pass through: access mode,
// append, truncate and sync modes. O_DIRECT, O_NOATIME, O_PATH and the
// like are dropped; O_CREAT/O_EXCL only mean something in CREATE.
const openFlags = unix.O_ACCMODE | unix.O_APPEND | unix.O_TRUNC | unix.O_SYNC | unix.O_DSYNC

func (s *Server) checkOpenFlags(flags uint32) (uint64, unix.Errno) {
	f := uint64(flags) & openFlags
	if f&unix.O_ACCMODE == unix.O_ACCMODE {
		return 0, unix.EINVAL
	}
	if s.readOnly && (f&unix.O_ACCMODE != unix.O_RDONLY || f&unix.O_TRUNC != 0) {
		return 0, unix.EROFS
	}
	return f, 0
}

// addHandle registers fd, opened on node with flags (kept for a snapshot,
// without O_TRUNC: re-opening must not truncate again).
func (s *Server) addHandle(fd int, dir bool, node uint64, flags uint64) (uint64, unix.Errno) {
	if len(s.handles) >= MaxHandles {
		unix.Close(fd)
		return 0, unix.ENFILE
	}
	fh := s.nextFh
	s.nextFh++
	s.handles[fh] = &handle{fd: fd, dir: dir, node: node, flags: flags &^ unix.O_TRUNC}
	return fh, 0
}

func openOut(o *out, fh uint64) {
	o.u64(fh)
	o.u32(0) // open_flags: no FOPEN_KEEP_CACHE, the host may have changed the file
	o.u32(0)
}

// open serves OPEN (regular files only) and OPENDIR.
func (s *Server) open(req Request, p *body) ([]byte, unix.Errno) {
	flags := p.u32()
	p.skip(4)
	if p.err != nil {
		return nil, 0
	}
	n, e := s.node(req.NodeID)
	if e != 0 {
		return nil, e
	}
	var f uint64
	dir := req.Opcode == opOpendir
	switch {
	case dir && n.mode != unix.S_IFDIR:
		return nil, unix.ENOTDIR
	case dir:
		f = unix.O_RDONLY | unix.O_DIRECTORY
	case n.mode == unix.S_IFDIR:
		return nil, unix.EISDIR
	case n.mode != unix.S_IFREG:
		return nil, unix.EACCES // host device nodes, fifos, sockets are not served
	default:
		if f, e = s.checkOpenFlags(flags); e != 0 {
			return nil, e
		}
	}
	fd, err := unix.Open(procPath(n.fd), int(f|unix.O_CLOEXEC|unix.O_NOCTTY), 0)
	if err != nil {
		return nil, errnoOf(err)
	}
	fh, e := s.addHandle(fd, dir, req.NodeID, f)
	if e != 0 {
		return nil, e
	}
	var o out
	openOut(&o, fh)
	return o.b, 0
}

// create serves CREATE: a regular file, created or opened, confined.
func (s *Server) create(req Request, p *body) ([]byte, unix.Errno) {
	flags, mode := p.u32(), p.u32()
	p.skip(8) // umask (already applied by the kernel), open_flags
	name := p.name(maxName)
	if p.err != nil {
		return nil, 0
	}
	parent, e := s.parentFor(req, name)
	if e != 0 {
		return nil, e
	}
	f, e := s.checkOpenFlags(flags)
	if e != 0 {
		return nil, e
	}
	mode &= 0o7777
	created := true
	fd, err := openBeneath(parent.fd, name, f|unix.O_CREAT|unix.O_EXCL, uint64(mode))
	if err == unix.EEXIST && flags&unix.O_EXCL == 0 {
		created = false
		fd, err = openBeneath(parent.fd, name, f, 0)
	}
	if err != nil {
		return nil, errnoOf(err)
	}
	st, err := fstat(fd)
	if err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, unix.EACCES
	}
	if created {
		if err := unix.Fchmod(fd, mode); err != nil {
			logger.WithError(err).Debug("virtio-fs: chmod of a created file")
		}
		owner(fd, req)
	}
	// The inode is the opened file itself, not whatever the name means now.
	pathFd, err := unix.Open(procPath(fd), unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(fd)
		return nil, errnoOf(err)
	}
	id, a, e := s.adopt(pathFd, parent, name)
	if e != 0 {
		unix.Close(fd)
		return nil, e
	}
	fh, e := s.addHandle(fd, false, id, f)
	if e != 0 {
		s.forget(id, 1)
		return nil, e
	}
	var o out
	o.entry(id, a)
	openOut(&o, fh)
	return o.b, 0
}

// ioIn is the common head of fuse_read_in and fuse_write_in.
func ioIn(p *body) (fh, off uint64, size uint32) {
	fh, off, size = p.u64(), p.u64(), p.u32()
	p.skip(4 + 8 + 4 + 4) // read/write_flags, lock_owner, flags, padding
	return
}

func (s *Server) read(p *body, maxBody int) ([]byte, unix.Errno) {
	fh, off, size := ioIn(p)
	if p.err != nil {
		return nil, 0
	}
	h, e := s.handleOf(fh, false)
	if e != 0 {
		return nil, e
	}
	if off > math.MaxInt64 {
		return nil, unix.EINVAL
	}
	buf := make([]byte, min(int(size), MaxWrite, maxBody))
	n, err := unix.Pread(h.fd, buf, int64(off))
	if err != nil {
		return nil, errnoOf(err)
	}
	return buf[:n], 0
}

func (s *Server) write(p *body) ([]byte, unix.Errno) {
	fh, off, size := ioIn(p)
	data := p.need(int(size))
	if p.err != nil {
		return nil, 0
	}
	if size > MaxWrite || off > math.MaxInt64 {
		return nil, unix.EINVAL
	}
	h, e := s.handleOf(fh, false)
	if e != 0 {
		return nil, e
	}
	n, err := unix.Pwrite(h.fd, data, int64(off))
	if err != nil {
		return nil, errnoOf(err)
	}
	var o out
	o.u32(uint32(n))
	o.u32(0)
	return o.b, 0
}

func (s *Server) release(p *body) unix.Errno {
	fh := p.u64()
	if p.err != nil {
		return 0
	}
	h, ok := s.handles[fh]
	if !ok {
		return unix.EBADF
	}
	delete(s.handles, fh)
	return errnoOf(nilOr(unix.Close(h.fd)))
}

func (s *Server) flush(p *body) unix.Errno {
	fh := p.u64()
	if p.err != nil {
		return 0
	}
	if _, ok := s.handles[fh]; !ok {
		return unix.EBADF
	}
	return 0
}

func (s *Server) fsync(p *body) unix.Errno {
	fh, flags := p.u64(), p.u32()
	if p.err != nil {
		return 0
	}
	h, ok := s.handles[fh]
	if !ok {
		return unix.EBADF
	}
	if flags&1 != 0 && !h.dir {
		return errnoOf(nilOr(unix.Fdatasync(h.fd)))
	}
	return errnoOf(nilOr(unix.Fsync(h.fd)))
}

// readdir serves READDIR and READDIRPLUS. Offsets are positions in the
// listing read at offset 0 (entry i has offset i+1), so a listing the guest
// reads in pieces is consistent.
func (s *Server) readdir(req Request, p *body, maxBody int) ([]byte, unix.Errno) {
	fh, off, size := ioIn(p)
	if p.err != nil {
		return nil, 0
	}
	h, e := s.handleOf(fh, true)
	if e != 0 {
		return nil, e
	}
	if off == 0 || h.entries == nil {
		if h.entries, e = listDir(h.fd); e != 0 {
			return nil, e
		}
	}
	plus := req.Opcode == opReaddirplus
	var dir *inode
	if plus {
		if dir, e = s.node(req.NodeID); e != 0 {
			return nil, e
		}
	}
	limit := min(int(size), maxBody)
	var o out
	for i := off; i < uint64(len(h.entries)); i++ {
		d := h.entries[i]
		need := direntSize(len(d.name))
		if plus {
			need += entryOutLen
		}
		if len(o.b)+need > limit {
			break
		}
		if plus {
			s.plusEntry(&o, dir, d)
		}
		o.dirent(d.ino, i+1, d.typ, d.name)
	}
	return o.b, 0
}

// plusEntry appends the entry_out of a READDIRPLUS entry: a counted lookup,
// or node id 0 (the kernel then makes no dentry) for "." and ".." and for
// names that vanished.
func (s *Server) plusEntry(o *out, dir *inode, d dirEntry) {
	if d.name != "." && d.name != ".." {
		if id, a, e := s.lookupName(dir, d.name); e == 0 {
			o.entry(id, a)
			return
		}
	}
	o.entry(0, attr{Ino: d.ino, Mode: d.typ << 12})
}

// listDir reads a whole directory from its start.
func listDir(fd int) ([]dirEntry, unix.Errno) {
	if _, err := unix.Seek(fd, 0, 0); err != nil {
		return nil, errnoOf(err)
	}
	entries := []dirEntry{}
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return nil, errnoOf(err)
		}
		if n <= 0 {
			return entries, 0
		}
		entries = parseDirents(buf[:n], entries)
		if len(entries) > maxDirEntries {
			return nil, unix.EOVERFLOW
		}
	}
}

// parseDirents parses struct linux_dirent64 records.
func parseDirents(b []byte, entries []dirEntry) []dirEntry {
	for len(b) >= 19 {
		reclen := int(binary.LittleEndian.Uint16(b[16:]))
		if reclen < 19 || reclen > len(b) {
			break
		}
		name := b[19:reclen]
		for i, c := range name {
			if c == 0 {
				name = name[:i]
				break
			}
		}
		entries = append(entries, dirEntry{ino: binary.LittleEndian.Uint64(b), typ: uint32(b[18]), name: string(name)})
		b = b[reclen:]
	}
	return entries
}
