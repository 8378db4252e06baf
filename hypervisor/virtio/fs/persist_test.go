package fs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// Save, restore and round trip together, in the manner of Firecracker's
// virtio persist tests: a live session is saved through the device state's
// encoding and restored into a fresh server (a restore) or into the same
// one (an in-place rollback), against the same directory.

func writeFile(t *testing.T, p, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// saveLoad passes a session through the device state's encoding, as a
// snapshot file holds it.
func saveLoad(t *testing.T, s *Server) *SessionState {
	t.Helper()
	b, err := snapshot.Save(State{Version: snapshot.Version, Tag: "t", Session: s.Session()})
	if err != nil {
		t.Fatal(err)
	}
	var st State
	if err := snapshot.Load(b, &st); err != nil {
		t.Fatal(err)
	}
	if st.Session == nil {
		t.Fatalf("a mounted server saved no session: %s", b)
	}
	return st.Session
}

// restored is a client of a new server on dir that restored ss.
func restored(t *testing.T, dir string, ro bool, ss *SessionState) *client {
	t.Helper()
	s, err := NewServer(dir, ro)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Restore(ss); err != nil {
		t.Fatalf("restore: %v", err)
	}
	return &client{t: t, s: s}
}

func (c *client) getattr(id uint64) unix.Errno {
	_, e := c.call(opGetattr, id, make([]byte, 16))
	return e
}

func (c *client) mustRead(id, fh uint64, want string) {
	c.t.Helper()
	if b, e := c.read(id, fh, 0, 100); e != 0 || string(b) != want {
		c.t.Fatalf("READ node %d fh %d = %q, %v; want %q", id, fh, b, e, want)
	}
}

func (c *client) rename(parent uint64, from string, newParent uint64, to string) {
	c.t.Helper()
	var in out
	in.u64(newParent)
	if _, e := c.call(opRename, parent, append(in.b, cstr(from, to)...)); e != 0 {
		c.t.Fatalf("RENAME %s -> %s: %v", from, to, e)
	}
}

func (c *client) unlink(parent uint64, name string) {
	c.t.Helper()
	if _, e := c.call(opUnlink, parent, cstr(name)); e != 0 {
		c.t.Fatalf("UNLINK %s: %v", name, e)
	}
}

// session is a live session over a tree: nodes looked up, files open for
// reading and writing, a directory open, a directory renamed with an open
// file beneath it, and a file unlinked while open.
type session struct {
	dir, sub, b, c, gone, created uint64 // node ids
	bFh, gFh, newFh, dirFh        uint64 // handles
}

func liveSession(t *testing.T, c *client) session {
	t.Helper()
	var s session
	s.dir = c.mustLookup(rootID, "a")
	s.b = c.mustLookup(s.dir, "b.txt")
	s.c = c.mustLookup(rootID, "c.txt")
	s.gone = c.mustLookup(rootID, "gone.txt")
	var e unix.Errno
	if s.bFh, e = c.open(s.b, unix.O_RDWR); e != 0 {
		t.Fatal(e)
	}
	if s.gFh, e = c.open(s.gone, unix.O_RDONLY); e != 0 {
		t.Fatal(e)
	}
	if s.created, s.newFh, e = c.create(rootID, "new.txt", unix.O_WRONLY|unix.O_TRUNC, 0o644); e != 0 {
		t.Fatal(e)
	}
	b, e := c.call(opOpendir, s.dir, make([]byte, 8))
	if e != 0 {
		t.Fatal(e)
	}
	s.dirFh = leU64(b)
	s.sub = mkdir(t, c, s.dir, "sub", 0o755)
	c.rename(rootID, "a", rootID, "A")         // b.txt's and sub's paths follow
	c.rename(rootID, "c.txt", s.dir, "c2.txt") // c.txt moves into A
	c.unlink(rootID, "gone.txt")               // open, unlinked: saved stale
	return s
}

func leU64(b []byte) uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

func TestSessionRoundTrip(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a", "b.txt"), "bee")
	writeFile(t, filepath.Join(dir, "c.txt"), "sea")
	writeFile(t, filepath.Join(dir, "gone.txt"), "gone")
	c := newClient(t, dir, false)
	s := liveSession(t, c)
	ss := saveLoad(t, c.s)
	paths := map[uint64]string{}
	for _, n := range ss.Nodes {
		paths[n.ID] = n.Path
		if n.ID == s.gone && !n.Stale {
			t.Errorf("the unlinked open file saved as %+v, want stale", n)
		}
	}
	want := map[uint64]string{rootID: "", s.dir: "A", s.b: "A/b.txt", s.sub: "A/sub", s.c: "A/c2.txt", s.created: "new.txt", s.gone: ""}
	for id, p := range want {
		if got, ok := paths[id]; !ok || got != p {
			t.Errorf("node %d saved with path %q (present %v), want %q", id, got, ok, p)
		}
	}

	r := restored(t, dir, false, ss)
	for _, id := range []uint64{rootID, s.dir, s.b, s.c, s.sub, s.created} {
		if e := r.getattr(id); e != 0 {
			t.Errorf("GETATTR of restored node %d (%s): %v", id, want[id], e)
		}
	}
	r.mustRead(s.b, s.bFh, "bee")
	if n, e := r.write(s.created, s.newFh, 0, []byte("after")); e != 0 || n != 5 {
		t.Fatalf("WRITE through a restored handle: %d, %v", n, e)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "new.txt")); string(b) != "after" {
		t.Errorf("host sees new.txt = %q", b)
	}
	if b, e := r.call(opReaddir, s.dir, ioBody(s.dirFh, 0, 4096)); e != 0 || len(b) == 0 {
		t.Errorf("READDIR through a restored directory handle: %d bytes, %v", len(b), e)
	}
	if e := r.getattr(s.gone); e != unix.ESTALE {
		t.Errorf("GETATTR of the unlinked node: %v, want ESTALE", e)
	}
	if _, e := r.read(s.gone, s.gFh, 0, 10); e != unix.EBADF {
		t.Errorf("READ through the unlinked file's handle: %v, want EBADF", e)
	}
	// The allocators go on past what the guest holds; a LOOKUP of a known
	// file is its restored node.
	if id := r.mustLookup(s.dir, "b.txt"); id != s.b {
		t.Errorf("LOOKUP A/b.txt after restore = node %d, want %d", id, s.b)
	}
	if id := r.mustLookup(rootID, "new.txt"); id != s.created {
		t.Errorf("LOOKUP new.txt = node %d, want %d", id, s.created)
	}
	writeFile(t, filepath.Join(dir, "later"), "")
	if id := r.mustLookup(rootID, "later"); id < ss.NextID {
		t.Errorf("a new node got id %d, below the saved allocator %d", id, ss.NextID)
	}
	// The stale node is forgotten like any other.
	r.s.forget(s.gone, 1)
	if _, ok := r.s.inodes[s.gone]; ok {
		t.Errorf("the stale node outlived FORGET")
	}
	// Saved again, the same session (the stale node was forgotten).
	again := saveLoad(t, r.s)
	if len(again.Handles) != len(ss.Handles)-1 {
		t.Errorf("re-saved %d handles, first save %d (one dropped)", len(again.Handles), len(ss.Handles))
	}
}

// TestSessionRestoreHostChanged: what the host removed or replaced between
// save and restore is stale (ESTALE, EBADF), the rest is served.
func TestSessionRestoreHostChanged(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "keep"), "keep")
	writeFile(t, filepath.Join(dir, "d", "removed"), "x")
	c := newClient(t, dir, false)
	keep, removed := c.mustLookup(rootID, "keep"), c.mustLookup(c.mustLookup(rootID, "d"), "removed")
	kFh, _ := c.open(keep, unix.O_RDONLY)
	rFh, _ := c.open(removed, unix.O_RDONLY)
	ss := saveLoad(t, c.s)
	if err := os.RemoveAll(filepath.Join(dir, "d")); err != nil {
		t.Fatal(err)
	}
	r := restored(t, dir, false, ss)
	r.mustRead(keep, kFh, "keep")
	if e := r.getattr(removed); e != unix.ESTALE {
		t.Errorf("GETATTR of a node removed on the host: %v, want ESTALE", e)
	}
	if _, e := r.read(removed, rFh, 0, 10); e != unix.EBADF {
		t.Errorf("READ of a file removed on the host: %v, want EBADF", e)
	}
}

// TestSessionRollbackInPlace: the same server restores a session it saved
// earlier: what the guest did since (lookups, opens) is gone, what it had
// at the snapshot is served again.
func TestSessionRollbackInPlace(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "f"), "old")
	writeFile(t, filepath.Join(dir, "g"), "g")
	c := newClient(t, dir, false)
	f := c.mustLookup(rootID, "f")
	fh, _ := c.open(f, unix.O_RDONLY)
	ss := saveLoad(t, c.s)
	g := c.mustLookup(rootID, "g")
	gFh, _ := c.open(g, unix.O_RDONLY)
	c.release(f, fh, false)
	c.s.forget(f, 1)
	writeFile(t, filepath.Join(dir, "f"), "host changed it") // the host's directory is not rolled back
	if err := c.s.Restore(ss); err != nil {
		t.Fatal(err)
	}
	c.mustRead(f, fh, "host changed it")
	if e := c.getattr(g); e != unix.ESTALE {
		t.Errorf("a node looked up after the snapshot: %v, want ESTALE", e)
	}
	if _, e := c.read(g, gFh, 0, 1); e != unix.EBADF {
		t.Errorf("a handle opened after the snapshot: %v, want EBADF", e)
	}
	if !c.s.Mounted() {
		t.Errorf("not mounted after restoring a mounted session")
	}
	if err := c.s.Restore(nil); err != nil || c.s.Mounted() {
		t.Errorf("restore of no session: %v, mounted %v", err, c.s.Mounted())
	}
}

// TestSessionRestoreHostile: a session that names paths through a symlink
// or outside the share never opens them; an invalid one is refused and the
// server keeps its session; a writable handle on a read-only share is
// dropped.
func TestSessionRestoreHostile(t *testing.T) {
	base := t.TempDir()
	share, outside := filepath.Join(base, "share"), filepath.Join(base, "outside")
	writeFile(t, filepath.Join(outside, "secret"), "secret")
	writeFile(t, filepath.Join(share, "f"), "f")
	if err := os.Symlink("../outside", filepath.Join(share, "esc")); err != nil {
		t.Fatal(err)
	}
	ss := &SessionState{Initialized: true, NextID: 10, NextFh: 10,
		Nodes: []NodeState{{ID: 1, Lookups: 5}, {ID: 2, Path: "esc/secret", Lookups: 1}, {ID: 3, Path: "esc", Lookups: 1},
			{ID: 4, Path: "f", Lookups: 1}},
		Handles: []HandleState{{FH: 1, Node: 2}, {FH: 2, Node: 3}, {FH: 3, Node: 4, Flags: unix.O_RDWR}, {FH: 4, Node: 4}}}
	r := restored(t, share, true, ss)
	if n := r.s.inodes[rootID].lookup; n != 5 {
		t.Errorf("the root's lookup count after the restore: %d, saved 5", n)
	}
	if e := r.getattr(2); e != unix.ESTALE {
		t.Errorf("a node through a symlink: %v, want ESTALE", e)
	}
	if e := r.getattr(3); e != 0 {
		t.Errorf("the symlink itself: %v", e)
	}
	for fh := uint64(1); fh <= 3; fh++ {
		if _, ok := r.s.handles[fh]; ok {
			t.Errorf("handle %d re-opened (through a symlink, on a symlink, or writable on a read-only share)", fh)
		}
	}
	r.mustRead(4, 4, "f")

	bad := *ss
	bad.Nodes = append([]NodeState(nil), ss.Nodes...)
	bad.Nodes[1].Path = "../outside/secret"
	if err := r.s.Restore(&bad); !errors.Is(err, errBadSession) || !errors.Is(err, snapshot.ErrCorrupt) {
		t.Fatalf("restore of a hostile session: %v, want errBadSession (ErrCorrupt)", err)
	}
	r.mustRead(4, 4, "f") // the server kept its session
}

// TestPathsFollowRenames: RENAME_EXCHANGE swaps recorded paths (and those
// beneath a directory), a RENAME over a held node marks it unlinked, RMDIR
// of a held directory too.
func TestPathsFollowRenames(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "x"), "x")
	writeFile(t, filepath.Join(dir, "y", "in"), "in")
	writeFile(t, filepath.Join(dir, "z"), "z")
	if err := os.Mkdir(filepath.Join(dir, "e"), 0o755); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, dir, false)
	x, y, z, e := c.mustLookup(rootID, "x"), c.mustLookup(rootID, "y"), c.mustLookup(rootID, "z"), c.mustLookup(rootID, "e")
	in := c.mustLookup(y, "in")
	var rn out
	rn.u64(rootID)
	rn.u32(unix.RENAME_EXCHANGE)
	rn.u32(0)
	if _, errno := c.call(opRename2, rootID, append(rn.b, cstr("x", "y")...)); errno != 0 {
		t.Fatalf("RENAME_EXCHANGE: %v", errno)
	}
	c.rename(rootID, "z", rootID, "y") // z over the file x (at "y" since the exchange)
	if _, errno := c.call(opRmdir, rootID, cstr("e")); errno != 0 {
		t.Fatalf("RMDIR: %v", errno)
	}
	got := map[uint64]string{}
	for _, n := range c.s.Session().Nodes {
		got[n.ID] = n.Path
		if n.Stale {
			got[n.ID] = "stale"
		}
	}
	want := map[uint64]string{x: "stale", y: "x", in: "x/in", z: "y", e: "stale"}
	for id, p := range want {
		if got[id] != p {
			t.Errorf("node %d recorded as %q, want %q (all: %v)", id, got[id], p, got)
		}
	}
}
