package agent

import (
	"fmt"
	"path"
	"sort"
	"strings"

	"github.com/cube-runtime/cube/guest-agent/protocol"
)

// A SyncTree request is checked completely before anything is written:
// planTree turns it into the order the entries are applied in (docs in
// agent.proto): directories and files parent first, then symbolic links
// (the top-level "..*" ones, the kubelet's "..data", first), then pruning.

// tmpPrefix names the temporary entries SyncTree renames over their final
// names; no listed entry may start with it.
const tmpPrefix = ".cube-sync-tmp."

const (
	maxNameLen   = 255
	maxTreePath  = 4096
	maxLinkLen   = 4096
	maxTreeDepth = 32
)

type treePlan struct {
	dirs, files, links []*protocol.TreeEntry
	// wanted maps every listed path to its kind.
	wanted map[string]protocol.TreeEntry_Kind
}

// validVolumeDir checks that dir is a clean absolute path strictly under root.
func validVolumeDir(dir, root string) error {
	if err := validFilePath(dir); err != nil {
		return err
	}
	if path.Clean(dir) != dir {
		return fmt.Errorf("path %q is not clean (%q)", dir, path.Clean(dir))
	}
	if !strings.HasPrefix(dir, root+"/") {
		return fmt.Errorf("path %q is not under %s", dir, root)
	}
	return nil
}

// validTreePath checks one entry's path relative to the tree's root.
func validTreePath(p string) error {
	if p == "" || len(p) > maxTreePath || strings.ContainsRune(p, 0) {
		return fmt.Errorf("entry path %q: must be 1..%d bytes without NUL", p, maxTreePath)
	}
	parts := strings.Split(p, "/")
	if len(parts) > maxTreeDepth {
		return fmt.Errorf("entry path %q: deeper than %d", p, maxTreeDepth)
	}
	for _, c := range parts {
		switch {
		case c == "" || c == "." || c == "..":
			return fmt.Errorf("entry path %q: empty, \".\" or \"..\" component (paths are relative and clean)", p)
		case len(c) > maxNameLen:
			return fmt.Errorf("entry path %q: a component is longer than %d bytes", p, maxNameLen)
		case strings.HasPrefix(c, tmpPrefix):
			return fmt.Errorf("entry path %q: names starting with %q are the agent's own", p, tmpPrefix)
		}
	}
	return nil
}

// validLinkTarget checks that a symbolic link at p with target stays inside
// the tree: relative, and not climbing above the root.
func validLinkTarget(p, target string) error {
	if target == "" || len(target) > maxLinkLen || strings.ContainsRune(target, 0) {
		return fmt.Errorf("symbolic link %q: target must be 1..%d bytes without NUL", p, maxLinkLen)
	}
	if strings.HasPrefix(target, "/") {
		return fmt.Errorf("symbolic link %q: absolute target %q leaves the tree", p, target)
	}
	if r := path.Join(path.Dir(p), target); r == ".." || strings.HasPrefix(r, "../") {
		return fmt.Errorf("symbolic link %q: target %q leaves the tree", p, target)
	}
	return nil
}

// planTree validates req's entries and orders them.
func planTree(req *protocol.SyncTreeRequest) (*treePlan, error) {
	if n := len(req.GetEntries()); n > protocol.MaxTreeEntries {
		return nil, fmt.Errorf("%d entries, more than %d", n, protocol.MaxTreeEntries)
	}
	if req.GetMode() > 0o7777 {
		return nil, fmt.Errorf("mode %o of the tree's root out of range", req.GetMode())
	}
	pl := &treePlan{wanted: make(map[string]protocol.TreeEntry_Kind, len(req.GetEntries()))}
	total := 0
	for _, e := range req.GetEntries() {
		p := e.GetPath()
		if err := validTreePath(p); err != nil {
			return nil, err
		}
		if _, dup := pl.wanted[p]; dup {
			return nil, fmt.Errorf("entry path %q listed twice", p)
		}
		if e.GetMode() > 0o7777 {
			return nil, fmt.Errorf("entry %q: mode %o out of range", p, e.GetMode())
		}
		if e.GetKind() != protocol.TreeEntry_FILE && len(e.GetData()) > 0 {
			return nil, fmt.Errorf("entry %q: data on a %s", p, e.GetKind())
		}
		if e.GetKind() != protocol.TreeEntry_SYMLINK && e.GetTarget() != "" {
			return nil, fmt.Errorf("entry %q: target on a %s", p, e.GetKind())
		}
		switch e.GetKind() {
		case protocol.TreeEntry_DIR:
			pl.dirs = append(pl.dirs, e)
		case protocol.TreeEntry_FILE:
			if total += len(e.GetData()); total > protocol.MaxTreeBytes {
				return nil, fmt.Errorf("more than %d bytes of file data", protocol.MaxTreeBytes)
			}
			pl.files = append(pl.files, e)
		case protocol.TreeEntry_SYMLINK:
			if err := validLinkTarget(p, e.GetTarget()); err != nil {
				return nil, err
			}
			pl.links = append(pl.links, e)
		default:
			return nil, fmt.Errorf("entry %q: unknown kind %d", p, e.GetKind())
		}
		pl.wanted[p] = e.GetKind()
	}
	for p := range pl.wanted {
		d := path.Dir(p)
		if k, ok := pl.wanted[d]; d != "." && (!ok || k != protocol.TreeEntry_DIR) {
			return nil, fmt.Errorf("entry %q: its parent %q is not a listed directory", p, d)
		}
	}
	byPath := func(s []*protocol.TreeEntry) {
		sort.Slice(s, func(i, j int) bool { return s[i].GetPath() < s[j].GetPath() })
	}
	// A parent's path is a prefix of its children's, so it sorts first.
	byPath(pl.dirs)
	byPath(pl.files)
	sort.Slice(pl.links, func(i, j int) bool {
		a, b := pl.links[i].GetPath(), pl.links[j].GetPath()
		if ia, ib := internalLink(a), internalLink(b); ia != ib {
			return ia
		}
		return a < b
	})
	return pl, nil
}

// internalLink: a top-level link named "..*" (the kubelet's "..data"): it
// switches the tree over, so it goes before the per-key links that read
// through it.
func internalLink(p string) bool {
	return strings.HasPrefix(p, "..") && !strings.Contains(p, "/")
}
