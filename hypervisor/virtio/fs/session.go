package fs

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// SessionState is the guest's FUSE session as the server sees it, carried
// through a snapshot so that the node ids and file handles the guest holds
// in its (restored) memory stay valid. Paths are relative to the share
// root. A snapshot file is untrusted input: Validate bounds every count and
// refuses any path that could leave the share before a restore uses it.
//
// State.Session (json "Session", omitted when nil: a share not mounted, as
// every version 1 snapshot before it was) carries it; see state.go.
type SessionState struct {
	Initialized bool   `json:"Initialized"`
	MaxWrite    uint32 `json:"MaxWrite"`
	Flags       uint32 `json:"Flags"`
	// NextID and NextFh are the server's allocators: a restored server must
	// not hand out an id or fh the guest still holds.
	NextID  uint64        `json:"NextID"`
	NextFh  uint64        `json:"NextFh"`
	Nodes   []NodeState   `json:"Nodes"`
	Handles []HandleState `json:"Handles"`
}

// NodeState is one inode-table entry. A stale node (the guest holds it but
// its path was unlinked, or could not be re-opened at a restore) has no
// path: after a restore every request on it is ESTALE until the guest
// forgets it.
type NodeState struct {
	ID         uint64 `json:"ID"`
	Path       string `json:"Path"`
	Lookups    uint64 `json:"Lookups"`
	Generation uint64 `json:"Generation"`
	Stale      bool   `json:"Stale,omitempty"`
}

// HandleState is one open file or directory handle: the node it was
// opened on and the open(2) flags (O_TRUNC never: a re-open must not
// truncate). A restore re-opens it through the node; a handle whose node is
// stale, or whose file no longer opens so, is dropped (EBADF on use).
type HandleState struct {
	FH    uint64 `json:"FH"`
	Node  uint64 `json:"Node"`
	Flags uint32 `json:"Flags"`
	Dir   bool   `json:"Dir"`
}

// Bounds on a session read from a snapshot file: no more than a server
// holds, and allocators far from wrapping around onto the root's id.
const (
	maxSessionNodes   = MaxInodes
	maxSessionHandles = MaxHandles
	maxSessionLookups = 1 << 40
	maxSessionNext    = 1 << 62
	// maxSessionComponents bounds the path components a restore opens
	// (one openat2 each): a hostile session of MaxInodes paths of maxPath
	// bytes would otherwise cost tens of millions.
	maxSessionComponents = 1 << 21
)

// errBadSession classes every refusal of a snapshot's session (as
// snapshot.ErrCorrupt).
var errBadSession = fmt.Errorf("virtio-fs snapshot session is invalid (the snapshot file is corrupt or hostile: take a new snapshot): %w", snapshot.ErrCorrupt)

// Validate checks a session read from a snapshot before it is used.
func (s *SessionState) Validate() error {
	if len(s.Nodes) > maxSessionNodes || len(s.Handles) > maxSessionHandles {
		return fmt.Errorf("%w: %d nodes, %d handles (limits %d, %d)", errBadSession,
			len(s.Nodes), len(s.Handles), maxSessionNodes, maxSessionHandles)
	}
	if s.NextID <= rootID || s.NextID > maxSessionNext || s.NextFh == 0 || s.NextFh > maxSessionNext {
		return fmt.Errorf("%w: allocators next id %d, next handle %d (want 2..2^62 and 1..2^62)", errBadSession, s.NextID, s.NextFh)
	}
	ids := make(map[uint64]bool, len(s.Nodes))
	components := 0
	for _, n := range s.Nodes {
		if components += strings.Count(n.Path, "/") + 1; components > maxSessionComponents {
			return fmt.Errorf("%w: more than %d path components in all", errBadSession, maxSessionComponents)
		}
		if n.ID == 0 || ids[n.ID] {
			return fmt.Errorf("%w: node id %d zero or repeated", errBadSession, n.ID)
		}
		ids[n.ID] = true
		if n.ID >= s.NextID {
			return fmt.Errorf("%w: node id %d not below the allocator's next id %d", errBadSession, n.ID, s.NextID)
		}
		if n.Lookups > maxSessionLookups || (n.Lookups == 0 && n.ID != rootID) {
			return fmt.Errorf("%w: node %d lookup count %d", errBadSession, n.ID, n.Lookups)
		}
		if err := validNode(n); err != nil {
			return fmt.Errorf("%w: node %d: %v", errBadSession, n.ID, err)
		}
	}
	fhs := make(map[uint64]bool, len(s.Handles))
	for _, h := range s.Handles {
		if fhs[h.FH] {
			return fmt.Errorf("%w: file handle %d repeated", errBadSession, h.FH)
		}
		fhs[h.FH] = true
		if h.FH >= s.NextFh {
			return fmt.Errorf("%w: file handle %d not below the allocator's next handle %d", errBadSession, h.FH, s.NextFh)
		}
		if !ids[h.Node] {
			return fmt.Errorf("%w: file handle %d names unknown node %d", errBadSession, h.FH, h.Node)
		}
		if h.Flags&^uint32(openFlags|unix.O_DIRECTORY) != 0 || h.Flags&unix.O_ACCMODE == unix.O_ACCMODE {
			return fmt.Errorf("%w: file handle %d open flags %#x", errBadSession, h.FH, h.Flags)
		}
	}
	return nil
}

// validNode: the root is id 1 with the empty path, a stale node has no
// path, and every other node a relative path of names.
func validNode(n NodeState) error {
	switch {
	case n.ID == rootID && (n.Path != "" || n.Stale):
		return fmt.Errorf("the root (id %d) has path %q, stale %v", rootID, n.Path, n.Stale)
	case n.ID == rootID:
		return nil
	case n.Stale && n.Path != "":
		return fmt.Errorf("stale node with path %q", n.Path)
	case n.Stale:
		return nil
	case n.Path == "":
		return errors.New("empty path (only the root has it)")
	}
	return validSessionPath(n.Path)
}

// validSessionPath accepts "" (the share root) or a relative path whose
// components are each a name LOOKUP would accept (validName): no leading
// '/', no "." or ".." or empty component, no NUL, bounded length.
func validSessionPath(p string) error {
	if p == "" {
		return nil
	}
	if len(p) > maxPath {
		return fmt.Errorf("path of %d bytes (limit %d)", len(p), maxPath)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return errors.New("path contains NUL")
	}
	if strings.HasPrefix(p, "/") {
		return fmt.Errorf("absolute path %q", p)
	}
	for _, c := range strings.Split(p, "/") {
		if validName(c) != 0 {
			return fmt.Errorf("path %q has component %q (not a name: empty, \".\", \"..\" or over %d bytes)", p, c, maxName)
		}
	}
	return nil
}
