package fs

import (
	"errors"
	"fmt"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// Attribute and entry cache lifetimes given to the guest, in seconds. Short:
// the host may change the shared directory behind the guest's back.
const (
	entryTimeout = 1
	attrTimeout  = 1
)

// Limits.
const (
	// MaxWrite is the largest WRITE (and READ) payload, negotiated at INIT.
	MaxWrite = 128 << 10
	// maxPages is MaxWrite in pages (fuse_init_out.max_pages).
	maxPages = MaxWrite / 4096
	// MaxInodes and MaxHandles bound the host file descriptors one share
	// holds (one O_PATH fd per looked-up inode, one per open file); past
	// them LOOKUP/OPEN fail with ENFILE until the guest forgets or closes.
	MaxInodes  = 1 << 15
	MaxHandles = 1 << 12
	// maxName is NAME_MAX; maxPath is PATH_MAX (symlink targets).
	maxName = 255
	maxPath = 4096
	// maxDirEntries bounds one directory listing held for a guest.
	maxDirEntries = 1 << 20
)

// rootID is FUSE_ROOT_ID.
const rootID = 1

// inodeKey identifies a host inode.
type inodeKey struct{ dev, ino uint64 }

// inode is a host file the guest looked up: an O_PATH fd (requests go
// through it, never through a path string, so renames on the host cannot
// redirect them) and the guest's lookup count. path is only what a
// snapshot records (see session.go): where the guest last saw the file,
// relative to the share root, kept right across the guest's RENAME, UNLINK
// and RMDIR.
type inode struct {
	fd     int // -1: stale (restored from a snapshot whose path was gone)
	key    inodeKey
	mode   uint32 // S_IFMT bits at lookup
	lookup uint64
	path   string // relative to the share root; "" is the root
	// unlinked: path no longer names the file (the guest removed it or
	// renamed another over it while holding it); a snapshot saves it stale.
	unlinked bool
}

// handle is an open file or directory.
type handle struct {
	fd      int
	dir     bool
	node    uint64     // the node it was opened on (a snapshot re-opens it by that node's path)
	flags   uint64     // the open(2) flags it was opened with (O_TRUNC dropped)
	entries []dirEntry // a directory's listing, read at OPENDIR/rewind
}

type dirEntry struct {
	ino  uint64
	typ  uint32
	name string
}

// Server is a FUSE server passing through one host directory. It is not
// safe for concurrent use (the device serializes requests).
type Server struct {
	root     string
	readOnly bool

	mu      sync.Mutex
	inodes  map[uint64]*inode
	byKey   map[inodeKey]uint64
	nextID  uint64
	handles map[uint64]*handle
	nextFh  uint64
	// mounted is true between INIT and DESTROY (or Reset); initFlags are
	// the INIT flags answered (a snapshot carries them).
	mounted   bool
	initFlags uint32
}

// NewServer opens dir (which must be a directory) as the share's root.
func NewServer(dir string, readOnly bool) (*Server, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("virtio-fs share %s: %w", dir, err)
	}
	s := &Server{root: dir, readOnly: readOnly}
	st, err := fstat(fd)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("virtio-fs share %s: %w", dir, err)
	}
	s.reset()
	root := &inode{fd: fd, key: keyOf(&st), mode: st.Mode & unix.S_IFMT, lookup: 1}
	s.inodes[rootID] = root
	s.byKey[root.key] = rootID
	return s, nil
}

// reset empties the tables (keeping the root).
func (s *Server) reset() {
	var root *inode
	if s.inodes != nil {
		root = s.inodes[rootID]
	}
	for id, n := range s.inodes {
		if id != rootID && n.fd >= 0 {
			unix.Close(n.fd)
		}
	}
	for _, h := range s.handles {
		unix.Close(h.fd)
	}
	s.inodes = map[uint64]*inode{}
	s.byKey = map[inodeKey]uint64{}
	s.handles = map[uint64]*handle{}
	s.nextID, s.nextFh = rootID+1, 1
	if root != nil {
		root.lookup = 1
		s.inodes[rootID] = root
		s.byKey[root.key] = rootID
	}
	s.mounted, s.initFlags = false, 0
}

// Reset forgets every inode and handle the guest had (a device reset or a
// restored snapshot: the guest's FUSE session is gone).
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reset()
}

// Mounted reports whether a guest FUSE session is live (INIT seen, no DESTROY).
func (s *Server) Mounted() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mounted
}

// Close releases every host fd, the root's included.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	root := s.inodes[rootID]
	s.reset()
	if root != nil {
		delete(s.inodes, rootID)
		return unix.Close(root.fd)
	}
	return nil
}

// Handle serves one request buffer and returns the reply (out header plus
// body; nil when the opcode has no reply: FORGET, BATCH_FORGET, INTERRUPT).
// maxReply is the guest's writable space: READ, READDIR and READLINK are
// sized to it. A request that does not parse is answered with EINVAL when
// its header can be read, and with nothing otherwise.
func (s *Server) Handle(buf []byte, maxReply int) []byte {
	req, err := ParseRequest(buf)
	if err != nil {
		logger.WithError(err).Debug("virtio-fs: request refused")
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	body, errno, reply := s.dispatch(req, maxReply-outHeaderLen)
	if !reply {
		return nil
	}
	if errno != 0 {
		return outHeader(req.Unique, -int32(errno), 0)
	}
	return append(outHeader(req.Unique, 0, len(body)), body...)
}

// dispatch runs one request: its reply body or an errno, and whether it
// has a reply at all.
func (s *Server) dispatch(req Request, maxBody int) ([]byte, unix.Errno, bool) {
	p := &body{b: req.Body}
	var (
		b     []byte
		errno unix.Errno
	)
	switch req.Opcode {
	case opForget:
		s.forget(req.NodeID, p.u64())
		return nil, 0, false
	case opBatchForget:
		s.batchForget(p)
		return nil, 0, false
	case opInterrupt:
		return nil, 0, false // requests complete synchronously: nothing to interrupt
	case opInit:
		b, errno = s.init(p)
		return b, errno, true
	}
	if !s.mounted {
		return nil, unix.EIO, true
	}
	if maxBody < 0 {
		maxBody = 0
	}
	switch req.Opcode {
	case opDestroy:
		s.reset()
	case opLookup:
		b, errno = s.lookup(req, p)
	case opGetattr:
		b, errno = s.getattr(req, p)
	case opSetattr:
		b, errno = s.setattr(req, p)
	case opReadlink:
		b, errno = s.readlink(req, maxBody)
	case opSymlink:
		b, errno = s.symlink(req, p)
	case opMkdir:
		b, errno = s.mkdir(req, p)
	case opUnlink, opRmdir:
		errno = s.remove(req, p)
	case opRename, opRename2:
		errno = s.rename(req, p)
	case opOpen, opOpendir:
		b, errno = s.open(req, p)
	case opCreate:
		b, errno = s.create(req, p)
	case opRead:
		b, errno = s.read(p, maxBody)
	case opWrite:
		b, errno = s.write(p)
	case opRelease, opReleasedir:
		errno = s.release(p)
	case opFlush:
		errno = s.flush(p)
	case opFsync, opFsyncdir:
		errno = s.fsync(p)
	case opReaddir, opReaddirplus:
		b, errno = s.readdir(req, p, maxBody)
	case opStatfs:
		b, errno = s.statfs(req)
	case opAccess:
		errno = s.access(req, p)
	default:
		errno = unix.ENOSYS
	}
	if p.err != nil {
		logger.WithError(p.err).WithField("opcode", req.Opcode).Debug("virtio-fs: request refused")
		return nil, unix.EINVAL, true
	}
	return b, errno, true
}

// init answers FUSE_INIT.
func (s *Server) init(p *body) ([]byte, unix.Errno) {
	major, minor := p.u32(), p.u32()
	p.u32() // max_readahead
	flags := p.u32()
	if p.err != nil {
		return nil, unix.EINVAL
	}
	if major != KernelVersion {
		return nil, unix.EPROTO
	}
	_ = minor
	s.reset()
	s.mounted = true
	s.initFlags = flags & (initAsyncRead | initBigWrites | initMaxPages | initParallelOp)
	var o out
	o.u32(KernelVersion)
	o.u32(KernelMinorVersion)
	o.u32(MaxWrite) // max_readahead
	o.u32(s.initFlags)
	o.u16(16)       // max_background
	o.u16(12)       // congestion_threshold
	o.u32(MaxWrite) // max_write
	o.u32(1)        // time_gran: nanoseconds
	o.u16(maxPages)
	o.u16(0) // map_alignment
	o.u32(0) // flags2
	o.u32(0) // max_stack_depth
	o.pad(initOutLen - len(o.b))
	return o.b, 0
}

// node returns the inode for a node id: ESTALE for an unknown id and for
// a node a restore could not re-open.
func (s *Server) node(id uint64) (*inode, unix.Errno) {
	n, ok := s.inodes[id]
	if !ok || n.fd < 0 {
		return nil, unix.ESTALE
	}
	return n, 0
}

// handleOf returns an open handle.
func (s *Server) handleOf(fh uint64, dir bool) (*handle, unix.Errno) {
	h, ok := s.handles[fh]
	if !ok || h.dir != dir {
		return nil, unix.EBADF
	}
	return h, 0
}

// validName refuses names that are not one path component.
func validName(name string) unix.Errno {
	if name == "" || name == "." || name == ".." || len(name) > maxName {
		return unix.EINVAL
	}
	for i := 0; i < len(name); i++ {
		if name[i] == '/' {
			return unix.EINVAL
		}
	}
	return 0
}

// procPath names fd through /proc/self/fd (re-opening an O_PATH fd).
func procPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

func errnoOf(err error) unix.Errno {
	var e unix.Errno
	if errors.As(err, &e) {
		return e
	}
	return unix.EIO
}
