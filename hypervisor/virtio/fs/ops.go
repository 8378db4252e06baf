package fs

import (
	"math"

	"golang.org/x/sys/unix"
)

func (s *Server) entryReply(id uint64, a attr) []byte {
	var o out
	o.entry(id, a)
	return o.b
}

func (s *Server) lookup(req Request, p *body) ([]byte, unix.Errno) {
	name := p.name(maxName)
	if p.err != nil {
		return nil, 0
	}
	parent, e := s.node(req.NodeID)
	if e != 0 {
		return nil, e
	}
	id, a, e := s.lookupName(parent, name)
	if e != 0 {
		return nil, e
	}
	return s.entryReply(id, a), 0
}

func (s *Server) getattr(req Request, p *body) ([]byte, unix.Errno) {
	p.u32() // getattr_flags: the fh, when given, names the same inode
	p.skip(4 + 8)
	n, e := s.node(req.NodeID)
	if e != 0 {
		return nil, e
	}
	return s.attrReply(n)
}

func (s *Server) attrReply(n *inode) ([]byte, unix.Errno) {
	st, err := fstat(n.fd)
	if err != nil {
		return nil, errnoOf(err)
	}
	var o out
	o.attrOut(attrOf(&st))
	return o.b, 0
}

// setattrIn is struct fuse_setattr_in.
type setattrIn struct {
	valid                            uint32
	fh, size                         uint64
	atime, mtime                     uint64
	atimeNs, mtimeNs, mode, uid, gid uint32
}

func parseSetattr(p *body) setattrIn {
	var in setattrIn
	in.valid = p.u32()
	p.skip(4)
	in.fh, in.size = p.u64(), p.u64()
	p.skip(8) // lock_owner
	in.atime, in.mtime = p.u64(), p.u64()
	p.skip(8) // ctime
	in.atimeNs, in.mtimeNs = p.u32(), p.u32()
	p.skip(4) // ctimensec
	in.mode = p.u32()
	p.skip(4)
	in.uid, in.gid = p.u32(), p.u32()
	p.skip(4)
	return in
}

func (s *Server) setattr(req Request, p *body) ([]byte, unix.Errno) {
	in := parseSetattr(p)
	if p.err != nil {
		return nil, 0
	}
	n, e := s.node(req.NodeID)
	if e != 0 {
		return nil, e
	}
	if s.readOnly {
		return nil, unix.EROFS
	}
	isLink := n.mode == unix.S_IFLNK
	if in.valid&fattrMode != 0 {
		if isLink {
			return nil, unix.EOPNOTSUPP
		}
		if err := unix.Fchmodat(unix.AT_FDCWD, procPath(n.fd), in.mode&0o7777, 0); err != nil {
			return nil, errnoOf(err)
		}
	}
	if in.valid&(fattrUID|fattrGID) != 0 {
		uid, gid := -1, -1
		if in.valid&fattrUID != 0 {
			uid = int(in.uid)
		}
		if in.valid&fattrGID != 0 {
			gid = int(in.gid)
		}
		if err := unix.Fchownat(n.fd, "", uid, gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return nil, errnoOf(err)
		}
	}
	if in.valid&fattrSize != 0 {
		if e := s.truncate(n, in); e != 0 {
			return nil, e
		}
	}
	if in.valid&(fattrAtime|fattrMtime) != 0 {
		if isLink {
			return nil, unix.EPERM
		}
		ts := []unix.Timespec{setTime(in.valid, fattrAtime, fattrAtimeNow, in.atime, in.atimeNs),
			setTime(in.valid, fattrMtime, fattrMtimeNow, in.mtime, in.mtimeNs)}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, procPath(n.fd), ts, 0); err != nil {
			return nil, errnoOf(err)
		}
	}
	return s.attrReply(n)
}

func (s *Server) truncate(n *inode, in setattrIn) unix.Errno {
	if in.size > math.MaxInt64 {
		return unix.EINVAL
	}
	if in.valid&fattrFh != 0 {
		if h, e := s.handleOf(in.fh, false); e == 0 {
			return errnoOf(nilOr(unix.Ftruncate(h.fd, int64(in.size))))
		}
	}
	switch n.mode {
	case unix.S_IFREG:
		return errnoOf(nilOr(unix.Truncate(procPath(n.fd), int64(in.size))))
	case unix.S_IFDIR:
		return unix.EISDIR
	}
	return unix.EINVAL
}

// nilOr keeps errnoOf(nil) at 0.
func nilOr(err error) error {
	if err == nil {
		return unix.Errno(0)
	}
	return err
}

func setTime(valid, set, now uint32, sec uint64, nsec uint32) unix.Timespec {
	switch {
	case valid&now != 0:
		return unix.Timespec{Nsec: unix.UTIME_NOW}
	case valid&set != 0:
		return unix.Timespec{Sec: int64(sec), Nsec: int64(nsec % 1e9)}
	}
	return unix.Timespec{Nsec: unix.UTIME_OMIT}
}

func (s *Server) readlink(req Request, maxBody int) ([]byte, unix.Errno) {
	n, e := s.node(req.NodeID)
	if e != 0 {
		return nil, e
	}
	if n.mode != unix.S_IFLNK {
		return nil, unix.EINVAL
	}
	buf := make([]byte, maxPath)
	k, err := unix.Readlinkat(n.fd, "", buf)
	if err != nil {
		return nil, errnoOf(err)
	}
	if k > maxBody {
		return nil, unix.ERANGE
	}
	return buf[:k], 0
}

// parentFor returns the parent inode of a name-creating or removing request.
func (s *Server) parentFor(req Request, name string) (*inode, unix.Errno) {
	if e := validName(name); e != 0 {
		return nil, e
	}
	parent, e := s.node(req.NodeID)
	if e != 0 {
		return nil, e
	}
	if s.readOnly {
		return nil, unix.EROFS
	}
	return parent, 0
}

func (s *Server) symlink(req Request, p *body) ([]byte, unix.Errno) {
	name, target := p.name(maxName), p.name(maxPath)
	if p.err != nil {
		return nil, 0
	}
	parent, e := s.parentFor(req, name)
	if e != 0 {
		return nil, e
	}
	if target == "" {
		return nil, unix.ENOENT
	}
	if err := unix.Symlinkat(target, parent.fd, name); err != nil {
		return nil, errnoOf(err)
	}
	return s.created(req, parent, name)
}

func (s *Server) mkdir(req Request, p *body) ([]byte, unix.Errno) {
	mode := p.u32()
	p.skip(4) // umask: the kernel applied it (no FUSE_DONT_MASK)
	name := p.name(maxName)
	if p.err != nil {
		return nil, 0
	}
	parent, e := s.parentFor(req, name)
	if e != 0 {
		return nil, e
	}
	if err := unix.Mkdirat(parent.fd, name, mode&0o7777); err != nil {
		return nil, errnoOf(err)
	}
	return s.createdMode(req, parent, name, mode&0o7777)
}

// created looks up what the guest just created, gives it to the guest's
// user and answers an entry.
func (s *Server) created(req Request, parent *inode, name string) ([]byte, unix.Errno) {
	id, _, e := s.lookupName(parent, name)
	if e != 0 {
		return nil, e
	}
	n := s.inodes[id]
	owner(n.fd, req)
	st, err := fstat(n.fd)
	if err != nil {
		return nil, errnoOf(err)
	}
	return s.entryReply(id, attrOf(&st)), 0
}

// createdMode is created plus the exact mode the guest asked for (the
// VMM's umask narrowed it).
func (s *Server) createdMode(req Request, parent *inode, name string, mode uint32) ([]byte, unix.Errno) {
	id, _, e := s.lookupName(parent, name)
	if e != 0 {
		return nil, e
	}
	n := s.inodes[id]
	if n.mode == unix.S_IFDIR || n.mode == unix.S_IFREG {
		if err := unix.Fchmodat(unix.AT_FDCWD, procPath(n.fd), mode, 0); err != nil {
			logger.WithError(err).Debug("virtio-fs: chmod of a created file")
		}
	}
	owner(n.fd, req)
	st, err := fstat(n.fd)
	if err != nil {
		return nil, errnoOf(err)
	}
	return s.entryReply(id, attrOf(&st)), 0
}

func (s *Server) remove(req Request, p *body) unix.Errno {
	name := p.name(maxName)
	if p.err != nil {
		return 0
	}
	parent, e := s.parentFor(req, name)
	if e != 0 {
		return e
	}
	flags := 0
	if req.Opcode == opRmdir {
		flags = unix.AT_REMOVEDIR
	}
	if err := unix.Unlinkat(parent.fd, name, flags); err != nil {
		return errnoOf(err)
	}
	s.unlinkedPath(parent, name)
	return 0
}

func (s *Server) rename(req Request, p *body) unix.Errno {
	newDir := p.u64()
	var flags uint32
	if req.Opcode == opRename2 {
		flags = p.u32()
		p.skip(4)
	}
	oldName, newName := p.name(maxName), p.name(maxName)
	if p.err != nil {
		return 0
	}
	if flags&^(unix.RENAME_NOREPLACE|unix.RENAME_EXCHANGE) != 0 {
		return unix.EINVAL
	}
	oldParent, e := s.parentFor(req, oldName)
	if e != 0 {
		return e
	}
	if e := validName(newName); e != 0 {
		return e
	}
	newParent, e := s.node(newDir)
	if e != 0 {
		return e
	}
	if err := unix.Renameat2(oldParent.fd, oldName, newParent.fd, newName, uint(flags)); err != nil {
		return errnoOf(err)
	}
	s.renamedPath(oldParent, oldName, newParent, newName, flags&unix.RENAME_EXCHANGE != 0)
	return 0
}

func (s *Server) statfs(req Request) ([]byte, unix.Errno) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(s.inodes[rootID].fd, &st); err != nil {
		return nil, errnoOf(err)
	}
	var o out
	for _, v := range []uint64{st.Blocks, st.Bfree, st.Bavail, st.Files, st.Ffree} {
		o.u64(v)
	}
	o.u32(uint32(st.Bsize))
	o.u32(uint32(st.Namelen))
	o.u32(uint32(st.Frsize))
	o.pad(statfsOutLen - len(o.b))
	return o.b, 0
}

// access checks mask against the inode's mode bits for the requesting
// guest user (the guest kernel checks permissions itself too: virtiofs
// mounts with default_permissions).
func (s *Server) access(req Request, p *body) unix.Errno {
	mask := p.u32()
	p.skip(4)
	if p.err != nil {
		return 0
	}
	n, e := s.node(req.NodeID)
	if e != 0 {
		return e
	}
	st, err := fstat(n.fd)
	if err != nil {
		return errnoOf(err)
	}
	if mask&unix.W_OK != 0 && s.readOnly {
		return unix.EROFS
	}
	if req.UID == 0 {
		if mask&unix.X_OK != 0 && st.Mode&0o111 == 0 && n.mode != unix.S_IFDIR {
			return unix.EACCES
		}
		return 0
	}
	bits := st.Mode & 0o7
	switch {
	case req.UID == st.Uid:
		bits = (st.Mode >> 6) & 0o7
	case req.GID == st.Gid:
		bits = (st.Mode >> 3) & 0o7
	}
	if mask&7&^bits != 0 {
		return unix.EACCES
	}
	return 0
}
