package fs

import (
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Session returns the guest's FUSE session for a snapshot, or nil when the
// share is not mounted. Nodes and handles are in id order (a snapshot of
// the same session is the same bytes).
func (s *Server) Session() *SessionState {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.mounted {
		return nil
	}
	ss := &SessionState{Initialized: true, MaxWrite: MaxWrite, Flags: s.initFlags, NextID: s.nextID, NextFh: s.nextFh,
		Nodes: make([]NodeState, 0, len(s.inodes)), Handles: make([]HandleState, 0, len(s.handles))}
	for id, n := range s.inodes {
		ns := NodeState{ID: id, Path: n.path, Lookups: n.lookup}
		if id != rootID && (n.unlinked || n.fd < 0) {
			ns.Path, ns.Stale = "", true
		}
		ss.Nodes = append(ss.Nodes, ns)
	}
	for fh, h := range s.handles {
		if _, ok := s.inodes[h.node]; !ok {
			continue // the guest forgot the node of an open file: nothing to re-open it by
		}
		ss.Handles = append(ss.Handles, HandleState{FH: fh, Node: h.node, Flags: uint32(h.flags), Dir: h.dir})
	}
	slices.SortFunc(ss.Nodes, func(a, b NodeState) int { return cmpU64(a.ID, b.ID) })
	slices.SortFunc(ss.Handles, func(a, b HandleState) int { return cmpU64(a.FH, b.FH) })
	return ss
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Restore replaces the server's session with a snapshot's, against the
// server's own directory (the one it was opened on, which may differ from
// the snapshot's: a restore on another host): each node is re-opened by its
// path, one confined component at a time, and each handle through its node
// with its flags. A node whose path no longer opens is kept stale (ESTALE
// on use), a handle that no longer opens is dropped (EBADF on use). A nil
// or uninitialized session resets the server (the share was not mounted).
// An invalid session is refused and the server left as it was.
func (s *Server) Restore(ss *SessionState) error {
	if ss == nil || !ss.Initialized {
		s.Reset()
		return nil
	}
	if err := ss.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	root := s.inodes[rootID]
	if root == nil {
		return fmt.Errorf("virtio-fs share %s: the server is closed", s.root)
	}
	inodes, byKey, rootLookups := s.reopenNodes(root, ss.Nodes)
	handles := s.reopenHandles(inodes, ss.Handles)
	// Ordering: the old session's fds are closed only once the new one is
	// built (nothing above can fail), and reset keeps the root's fd (and
	// sets its count to 1: the saved one is set after).
	s.reset()
	s.inodes, s.byKey, s.handles = inodes, byKey, handles
	root.lookup = rootLookups
	s.nextID, s.nextFh = ss.NextID, ss.NextFh
	s.mounted, s.initFlags = true, ss.Flags&(initAsyncRead|initBigWrites|initMaxPages|initParallelOp)
	return nil
}

// reopenNodes builds an inode table from a validated session's nodes, and
// says the root's lookup count.
func (s *Server) reopenNodes(root *inode, nodes []NodeState) (map[uint64]*inode, map[inodeKey]uint64, uint64) {
	inodes := make(map[uint64]*inode, len(nodes)+1)
	byKey := make(map[inodeKey]uint64, len(nodes)+1)
	rootLookups := uint64(1)
	inodes[rootID], byKey[root.key] = root, rootID
	for _, ns := range nodes {
		if ns.ID == rootID {
			rootLookups = max(ns.Lookups, 1)
			continue
		}
		n := &inode{fd: -1, lookup: ns.Lookups, unlinked: true}
		inodes[ns.ID] = n
		if ns.Stale {
			continue
		}
		fd, err := openPath(root.fd, ns.Path)
		if err != nil {
			logger.WithError(err).WithField("path", ns.Path).Debug("virtio-fs restore: a node's path is gone, the node is stale")
			continue
		}
		st, err := fstat(fd)
		if err != nil {
			unix.Close(fd)
			continue
		}
		n.fd, n.key, n.mode, n.path, n.unlinked = fd, keyOf(&st), st.Mode&unix.S_IFMT, ns.Path, false
		if _, dup := byKey[n.key]; !dup {
			byKey[n.key] = ns.ID
		}
	}
	return inodes, byKey, rootLookups
}

// reopenHandles re-opens a validated session's handles on the new nodes,
// with the checks OPEN and OPENDIR make.
func (s *Server) reopenHandles(inodes map[uint64]*inode, hs []HandleState) map[uint64]*handle {
	handles := make(map[uint64]*handle, len(hs))
	for _, hs := range hs {
		n := inodes[hs.Node]
		if n == nil || n.fd < 0 {
			continue
		}
		var f uint64
		switch {
		case hs.Dir && n.mode == unix.S_IFDIR:
			f = unix.O_RDONLY | unix.O_DIRECTORY
		case hs.Dir || n.mode != unix.S_IFREG:
			continue
		default:
			var e unix.Errno
			if f, e = s.checkOpenFlags(hs.Flags); e != 0 {
				continue
			}
			f &^= unix.O_TRUNC
		}
		fd, err := unix.Open(procPath(n.fd), int(f|unix.O_CLOEXEC|unix.O_NOCTTY), 0)
		if err != nil {
			logger.WithError(err).WithField("path", n.path).Debug("virtio-fs restore: an open file does not re-open, its handle is dropped")
			continue
		}
		handles[hs.FH] = &handle{fd: fd, dir: hs.Dir, node: hs.Node, flags: f}
	}
	return handles
}

// openPath opens a validated relative path beneath dir as an O_PATH fd,
// one component at a time with openBeneath (no symlink is followed, no
// component leaves the share).
func openPath(dir int, path string) (int, error) {
	cur := dir
	for rest := path; rest != ""; {
		name := rest
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			name, rest = rest[:i], rest[i+1:]
		} else {
			rest = ""
		}
		if e := validName(name); e != 0 {
			closeUnless(cur, dir)
			return -1, fmt.Errorf("path %q: component %q: %w", path, name, e)
		}
		fd, err := openBeneath(cur, name, unix.O_PATH, 0)
		closeUnless(cur, dir)
		if err != nil {
			return -1, fmt.Errorf("path %q: %w", path, err)
		}
		cur = fd
	}
	return cur, nil
}

func closeUnless(fd, keep int) {
	if fd != keep {
		unix.Close(fd)
	}
}
