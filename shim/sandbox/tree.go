package sandbox

// TreeKind is the kind of one TreeEntry.
type TreeKind int

const (
	TreeDir TreeKind = iota
	TreeFile
	TreeSymlink
)

func (k TreeKind) String() string {
	switch k {
	case TreeDir:
		return "directory"
	case TreeFile:
		return "file"
	case TreeSymlink:
		return "symbolic link"
	}
	return "unknown"
}

// TreeEntry mirrors cube.agent.v1.TreeEntry: one entry of a tree copied
// into the guest, Path relative to the tree's root.
type TreeEntry struct {
	Path           string
	Kind           TreeKind
	Mode, UID, GID uint32
	Data           []byte // a file's
	Target         string // a link's
}

// Tree is a whole directory tree as SyncTree writes it: its root's mode and
// owner and every entry below it.
type Tree struct {
	Mode, UID, GID uint32
	Entries        []TreeEntry
}

// TreeResult is what a SyncTree changed.
type TreeResult struct{ Written, Removed uint32 }

// VolumeRequest mirrors cube.agent.v1.PrepareVolumeRequest.
type VolumeRequest struct {
	Path      string
	Mode      uint32
	Tmpfs     bool
	TmpfsSize uint64
	// VirtiofsTag: mount the virtio-fs share with this tag at Path (unless
	// something is mounted there already).
	VirtiofsTag string
}
