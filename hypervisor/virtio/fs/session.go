package fs

import (
	"errors"
	"fmt"
	"strings"
)

// SessionState is the guest's FUSE session as the server sees it, carried
// through a snapshot so that the node ids and file handles the guest holds
// in its (restored) memory stay valid. Paths are relative to the share
// root. A snapshot file is untrusted input: Validate bounds every count and
// refuses any path that could leave the share before a restore uses it.
//
// Not wired into State yet (issue 17 item 1, work in progress): State.Session
// with json "Session,omitempty" keeps older snapshots loadable, so adding it
// needs no snapshot.Version bump.
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

// NodeState is one inode-table entry.
type NodeState struct {
	ID         uint64 `json:"ID"`
	Path       string `json:"Path"`
	Lookups    uint64 `json:"Lookups"`
	Generation uint64 `json:"Generation"`
}

// HandleState is one open file or directory handle.
type HandleState struct {
	FH    uint64 `json:"FH"`
	Node  uint64 `json:"Node"`
	Flags uint32 `json:"Flags"`
	Dir   bool   `json:"Dir"`
}

// Bounds on a session read from a snapshot file.
const (
	maxSessionNodes   = 1 << 20
	maxSessionHandles = 1 << 16
	maxSessionLookups = 1 << 40
)

// errBadSession classes every refusal of a snapshot's session.
var errBadSession = errors.New("virtio-fs snapshot session is invalid (the snapshot file is corrupt or hostile: take a new snapshot)")

// Validate checks a session read from a snapshot before it is used.
func (s *SessionState) Validate() error {
	if len(s.Nodes) > maxSessionNodes || len(s.Handles) > maxSessionHandles {
		return fmt.Errorf("%w: %d nodes, %d handles (limits %d, %d)", errBadSession,
			len(s.Nodes), len(s.Handles), maxSessionNodes, maxSessionHandles)
	}
	ids := make(map[uint64]bool, len(s.Nodes))
	for _, n := range s.Nodes {
		if n.ID == 0 || ids[n.ID] {
			return fmt.Errorf("%w: node id %d zero or repeated", errBadSession, n.ID)
		}
		ids[n.ID] = true
		if n.ID >= s.NextID {
			return fmt.Errorf("%w: node id %d not below the allocator's next id %d", errBadSession, n.ID, s.NextID)
		}
		if n.Lookups > maxSessionLookups {
			return fmt.Errorf("%w: node %d lookup count %d", errBadSession, n.ID, n.Lookups)
		}
		if err := validSessionPath(n.Path); err != nil {
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
	}
	return nil
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
