package fs

import "strings"

// Recorded paths. Requests never use them (they go through each inode's
// O_PATH fd); a snapshot does: it saves each node as its path relative to
// the share root, and a restore re-opens it by that path (session.go). So
// the server keeps each inode's path right across what the guest does to
// names: LOOKUP/CREATE/MKDIR/SYMLINK record it, RENAME moves it (and the
// paths of everything beneath a renamed directory), UNLINK/RMDIR and a
// RENAME over it mark it unlinked. Changes the host makes behind the
// guest's back are not seen until the guest looks the name up again.

// childPath is the path of name under parent; unlinked when the parent's
// path is unknown or the result would be longer than a snapshot accepts.
func childPath(parent *inode, name string) (string, bool) {
	if parent.unlinked {
		return "", true
	}
	p := name
	if parent.path != "" {
		p = parent.path + "/" + name
	}
	if len(p) > maxPath {
		return "", true
	}
	return p, false
}

// under reports whether p is dir or beneath it.
func under(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// unlinkedPath marks what the guest just removed (name under parent), and
// anything recorded beneath it, unlinked.
func (s *Server) unlinkedPath(parent *inode, name string) {
	gone, unknown := childPath(parent, name)
	if unknown {
		return
	}
	for id, n := range s.inodes {
		if id != rootID && !n.unlinked && under(n.path, gone) {
			n.unlinked, n.path = true, ""
		}
	}
}

// renamedPath follows a successful RENAME of oldName under oldParent to
// newName under newParent: what was recorded at the old path (or beneath
// it) is now at the new one; what was at the new path is unlinked, or,
// for RENAME_EXCHANGE, at the old one.
func (s *Server) renamedPath(oldParent *inode, oldName string, newParent *inode, newName string, exchange bool) {
	from, fromUnknown := childPath(oldParent, oldName)
	to, toUnknown := childPath(newParent, newName)
	if fromUnknown && toUnknown {
		return
	}
	for id, n := range s.inodes {
		if id == rootID || n.unlinked {
			continue
		}
		switch {
		case !fromUnknown && under(n.path, from):
			n.path, n.unlinked = moved(n.path, from, to, toUnknown)
		case !toUnknown && under(n.path, to) && exchange:
			n.path, n.unlinked = moved(n.path, to, from, fromUnknown)
		case !toUnknown && under(n.path, to):
			n.path, n.unlinked = "", true
		}
	}
}

// moved is p, beneath from, re-rooted at to.
func moved(p, from, to string, toUnknown bool) (string, bool) {
	if toUnknown {
		return "", true
	}
	np := to + p[len(from):]
	if len(np) > maxPath {
		return "", true
	}
	return np, false
}
