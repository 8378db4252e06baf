package fs

import (
	"golang.org/x/sys/unix"
)

// Confinement: every host path the server resolves is one component (no
// '/', not "." or "..") looked up with openat2 relative to the parent's
// O_PATH fd, with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS
// and O_NOFOLLOW: a symlink in the share is an inode the guest can read
// (READLINK) but the host never follows, and nothing resolves above the
// share's root. Files are re-opened through /proc/self/fd/N of their O_PATH
// fd (the same inode, whatever happened to its name since), and only
// regular files and directories are opened at all (no host device nodes,
// fifos or sockets).
const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

func fstat(fd int) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(fd, "", &st, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW)
	return st, err
}

func keyOf(st *unix.Stat_t) inodeKey { return inodeKey{dev: st.Dev, ino: st.Ino} }

func attrOf(st *unix.Stat_t) attr {
	return attr{
		Ino: st.Ino, Size: uint64(st.Size), Blocks: uint64(st.Blocks),
		Atime: uint64(st.Atim.Sec), Mtime: uint64(st.Mtim.Sec), Ctime: uint64(st.Ctim.Sec),
		AtimeNs: uint32(st.Atim.Nsec), MtimeNs: uint32(st.Mtim.Nsec), CtimeNs: uint32(st.Ctim.Nsec),
		Mode: st.Mode, Nlink: uint32(st.Nlink), UID: st.Uid, GID: st.Gid, Rdev: uint32(st.Rdev),
		Blksize: uint32(st.Blksize),
	}
}

// openBeneath opens one component under dir, confined.
func openBeneath(dir int, name string, flags uint64, mode uint64) (int, error) {
	return unix.Openat2(dir, name, &unix.OpenHow{
		Flags: flags | unix.O_NOFOLLOW | unix.O_CLOEXEC, Mode: mode, Resolve: resolveFlags,
	})
}

// lookupName looks name up under parent and counts one guest reference.
func (s *Server) lookupName(parent *inode, name string) (uint64, attr, unix.Errno) {
	if e := validName(name); e != 0 {
		return 0, attr{}, e
	}
	fd, err := openBeneath(parent.fd, name, unix.O_PATH, 0)
	if err != nil {
		return 0, attr{}, errnoOf(err)
	}
	return s.adopt(fd, parent, name)
}

// adopt takes an O_PATH fd, found as name under parent, as an inode (or a
// new reference to the inode already known for the same host file) and
// counts one guest reference. The inode's recorded path becomes this one:
// a name that just resolved is where the file is now.
func (s *Server) adopt(fd int, parent *inode, name string) (uint64, attr, unix.Errno) {
	st, err := fstat(fd)
	if err != nil {
		unix.Close(fd)
		return 0, attr{}, errnoOf(err)
	}
	path, unlinked := childPath(parent, name)
	if id, ok := s.byKey[keyOf(&st)]; ok {
		unix.Close(fd)
		n := s.inodes[id]
		n.lookup++
		n.path, n.unlinked = path, unlinked
		return id, attrOf(&st), 0
	}
	if len(s.inodes) >= MaxInodes {
		unix.Close(fd)
		return 0, attr{}, unix.ENFILE
	}
	id := s.nextID
	s.nextID++
	n := &inode{fd: fd, key: keyOf(&st), mode: st.Mode & unix.S_IFMT, lookup: 1, path: path, unlinked: unlinked}
	s.inodes[id] = n
	s.byKey[n.key] = id
	return id, attrOf(&st), 0
}

// forget drops nlookup guest references to id.
func (s *Server) forget(id, nlookup uint64) {
	n, ok := s.inodes[id]
	if !ok || id == rootID {
		return
	}
	n.lookup -= min(n.lookup, nlookup)
	if n.lookup == 0 {
		if n.fd >= 0 {
			unix.Close(n.fd)
		}
		delete(s.inodes, id)
		// A restore may have given two node ids the same host file (two
		// paths to one inode): the key is this node's only if it maps here.
		if s.byKey[n.key] == id {
			delete(s.byKey, n.key)
		}
	}
}

func (s *Server) batchForget(p *body) {
	count := p.u32()
	p.skip(4)
	for i := uint32(0); i < count && p.err == nil && len(p.b) >= forgetOneLen; i++ {
		id, nlookup := p.u64(), p.u64()
		s.forget(id, nlookup)
	}
}

// owner makes a file the guest created belong to the requesting guest
// user, as a local filesystem would. Best effort: a VMM that is not root
// cannot chown, and the file then belongs to the VMM's user.
func owner(fd int, req Request) {
	if err := unix.Fchownat(fd, "", int(req.UID), int(req.GID), unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
		logger.WithError(err).Debug("virtio-fs: cannot give a created file to the guest's user")
	}
}
