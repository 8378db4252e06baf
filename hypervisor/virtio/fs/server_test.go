package fs

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestServerReadWriteList(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "host.txt"), []byte("from the host"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, dir, false)

	// Host file -> guest read.
	id := c.mustLookup(rootID, "host.txt")
	fh, e := c.open(id, unix.O_RDONLY)
	if e != 0 {
		t.Fatalf("OPEN: %v", e)
	}
	if b, e := c.read(id, fh, 5, 100); e != 0 || string(b) != "the host" {
		t.Fatalf("READ = %q, %v", b, e)
	}
	if e := c.release(id, fh, false); e != 0 {
		t.Fatalf("RELEASE: %v", e)
	}

	// Guest create+write -> host file.
	sub := mkdir(t, c, rootID, "sub", 0o750)
	nid, fh, e := c.create(sub, "new.txt", unix.O_WRONLY, 0o640)
	if e != 0 {
		t.Fatalf("CREATE: %v", e)
	}
	if n, e := c.write(nid, fh, 0, []byte("from the guest")); e != 0 || n != 14 {
		t.Fatalf("WRITE = %d, %v", n, e)
	}
	var fs out
	fs.u64(fh)
	fs.u32(0)
	fs.u32(0)
	if _, e := c.call(opFsync, nid, fs.b); e != 0 {
		t.Fatalf("FSYNC: %v", e)
	}
	c.release(nid, fh, false)
	got, err := os.ReadFile(filepath.Join(dir, "sub", "new.txt"))
	if err != nil || string(got) != "from the guest" {
		t.Fatalf("host sees %q, %v", got, err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "sub", "new.txt")); fi.Mode().Perm() != 0o640 {
		t.Errorf("created mode %v, want 0640", fi.Mode().Perm())
	}
	if fi, _ := os.Stat(filepath.Join(dir, "sub")); fi.Mode().Perm() != 0o750 {
		t.Errorf("mkdir mode %v, want 0750", fi.Mode().Perm())
	}

	// Same host inode, same node id.
	if again := c.mustLookup(sub, "new.txt"); again != nid {
		t.Errorf("second LOOKUP gave node %d, first %d", again, nid)
	}

	// READDIR and READDIRPLUS.
	for _, plus := range []bool{false, true} {
		names := c.readdir(rootID, plus)
		for _, n := range []string{".", "..", "host.txt", "sub"} {
			if _, ok := names[n]; !ok {
				t.Errorf("readdir plus=%v: %q missing in %v", plus, n, names)
			}
		}
		if plus && names["sub"] != sub {
			t.Errorf("readdirplus: sub is node %d, want %d", names["sub"], sub)
		}
	}

	// SETATTR size, GETATTR.
	var sa out
	sa.u32(fattrSize)
	sa.pad(4 + 8)
	sa.u64(4)
	sa.pad(88 - len(sa.b))
	b, e := c.call(opSetattr, nid, sa.b)
	if e != 0 || binary.LittleEndian.Uint64(b[16+8:]) != 4 {
		t.Fatalf("SETATTR size: %v", e)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "sub", "new.txt")); string(got) != "from" {
		t.Errorf("after truncate host has %q", got)
	}

	// RENAME, SYMLINK, READLINK, UNLINK, RMDIR, STATFS.
	var rn out
	rn.u64(rootID)
	if _, e := c.call(opRename, sub, append(rn.b, cstr("new.txt", "moved.txt")...)); e != 0 {
		t.Fatalf("RENAME: %v", e)
	}
	if _, err := os.Stat(filepath.Join(dir, "moved.txt")); err != nil {
		t.Fatalf("rename not on the host: %v", err)
	}
	b, e = c.call(opSymlink, rootID, cstr("link", "moved.txt"))
	if e != 0 {
		t.Fatalf("SYMLINK: %v", e)
	}
	lid := binary.LittleEndian.Uint64(b)
	if b, e := c.call(opReadlink, lid, nil); e != 0 || string(b) != "moved.txt" {
		t.Fatalf("READLINK = %q, %v", b, e)
	}
	for _, op := range []struct {
		op   uint32
		name string
	}{{opUnlink, "link"}, {opUnlink, "moved.txt"}, {opRmdir, "sub"}} {
		if _, e := c.call(op.op, rootID, cstr(op.name)); e != 0 {
			t.Fatalf("op %d %s: %v", op.op, op.name, e)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("host dir has %d entries, want host.txt only", len(ents))
	}
	if b, e := c.call(opStatfs, rootID, nil); e != 0 || len(b) != statfsOutLen {
		t.Errorf("STATFS: %d bytes, %v", len(b), e)
	}
	var ac out
	ac.u32(unix.R_OK)
	ac.u32(0)
	if _, e := c.call(opAccess, rootID, ac.b); e != 0 {
		t.Errorf("ACCESS: %v", e)
	}
}

func mkdir(t *testing.T, c *client, parent uint64, name string, mode uint32) uint64 {
	t.Helper()
	var in out
	in.u32(mode)
	in.u32(0)
	b, e := c.call(opMkdir, parent, append(in.b, cstr(name)...))
	if e != 0 {
		t.Fatalf("MKDIR %s: %v", name, e)
	}
	return binary.LittleEndian.Uint64(b)
}

// TestServerConfinement: nothing the guest sends resolves outside the share.
func TestServerConfinement(t *testing.T) {
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// Host-made escape routes inside the share.
	must(t, os.Symlink(outside, filepath.Join(dir, "out")))
	must(t, os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "secretlink")))
	must(t, os.Symlink("../", filepath.Join(dir, "up")))
	c := newClient(t, dir, false)

	for _, name := range []string{"..", ".", "a/b", "../" + filepath.Base(outside), "", string(make([]byte, 300))} {
		if _, _, e := c.lookup(rootID, name); e == 0 {
			t.Errorf("LOOKUP %q succeeded", name)
		}
	}
	// A symlink is an inode of its own; it is never followed by the host.
	for _, link := range []string{"out", "up", "secretlink"} {
		id, mode, e := c.lookup(rootID, link)
		if e != 0 || mode&unix.S_IFMT != unix.S_IFLNK {
			t.Fatalf("LOOKUP %s: mode %o, %v", link, mode, e)
		}
		if _, _, e := c.lookup(id, "secret"); e == 0 {
			t.Errorf("LOOKUP through symlink %s succeeded", link)
		}
		if _, e := c.open(id, unix.O_RDONLY); e == 0 {
			t.Errorf("OPEN of symlink %s succeeded", link)
		}
		if _, _, e := c.create(id, "x", unix.O_WRONLY, 0o644); e == 0 {
			t.Errorf("CREATE under symlink %s succeeded", link)
		}
	}
	// Creating over a symlink does not write through it.
	if _, _, e := c.create(rootID, "secretlink", unix.O_WRONLY|unix.O_TRUNC, 0o644); e == 0 {
		t.Errorf("CREATE over a symlink to outside succeeded")
	}
	var rn out
	rn.u64(rootID)
	if _, e := c.call(opRename, rootID, append(rn.b, cstr("up", "../escaped")...)); e == 0 {
		t.Errorf("RENAME to ../escaped succeeded")
	}
	if got, _ := os.ReadFile(filepath.Join(outside, "secret")); string(got) != "secret" {
		t.Errorf("outside file changed: %q", got)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 1 {
		t.Errorf("outside dir has %d entries", len(ents))
	}
	// Unknown node ids and file handles.
	if _, e := c.call(opGetattr, 999, make([]byte, 16)); e != unix.ESTALE {
		t.Errorf("GETATTR of unknown node: %v, want ESTALE", e)
	}
	if _, e := c.read(rootID, 12345, 0, 10); e != unix.EBADF {
		t.Errorf("READ of unknown fh: %v, want EBADF", e)
	}
}

func TestServerReadOnly(t *testing.T) {
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644))
	c := newClient(t, dir, true)
	id := c.mustLookup(rootID, "f")
	if _, e := c.open(id, unix.O_RDWR); e != unix.EROFS {
		t.Errorf("OPEN rw: %v, want EROFS", e)
	}
	if _, _, e := c.create(rootID, "g", unix.O_WRONLY, 0o644); e != unix.EROFS {
		t.Errorf("CREATE: %v, want EROFS", e)
	}
	if _, e := c.call(opUnlink, rootID, cstr("f")); e != unix.EROFS {
		t.Errorf("UNLINK: %v, want EROFS", e)
	}
	if fh, e := c.open(id, unix.O_RDONLY); e != 0 {
		t.Errorf("OPEN ro: %v", e)
	} else if b, _ := c.read(id, fh, 0, 10); string(b) != "x" {
		t.Errorf("READ = %q", b)
	}
}

// TestServerForget: forgotten inodes close their host fds; the root stays.
func TestServerForget(t *testing.T) {
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "f"), nil, 0o644))
	c := newClient(t, dir, false)
	id := c.mustLookup(rootID, "f")
	c.mustLookup(rootID, "f")
	var fg out
	fg.u64(1)
	if r := c.s.Handle(request(opForget, id, 99, 0, fg.b), 100); r != nil {
		t.Fatalf("FORGET replied %d bytes", len(r))
	}
	if _, e := c.call(opGetattr, id, make([]byte, 16)); e != 0 {
		t.Fatalf("node gone after 1 of 2 forgets: %v", e)
	}
	var bf out
	bf.u32(2)
	bf.u32(0)
	bf.u64(id)
	bf.u64(1)
	bf.u64(rootID)
	bf.u64(1000)
	c.s.Handle(request(opBatchForget, 0, 100, 0, bf.b), 100)
	if _, e := c.call(opGetattr, id, make([]byte, 16)); e != unix.ESTALE {
		t.Fatalf("node after all forgets: %v, want ESTALE", e)
	}
	if _, e := c.call(opGetattr, rootID, make([]byte, 16)); e != 0 {
		t.Fatalf("root forgotten: %v", e)
	}
}

func TestServerMalformed(t *testing.T) {
	c := newClient(t, t.TempDir(), false)
	// A header that claims more than the buffer: no reply at all.
	b := request(opLookup, rootID, 1, 0, cstr("x"))
	binary.LittleEndian.PutUint32(b, 4096)
	if r := c.s.Handle(b, 4096); r != nil {
		t.Errorf("lying header answered")
	}
	// Bodies shorter than their struct, names without NUL: EINVAL.
	for _, tc := range []struct {
		op   uint32
		body []byte
	}{{opLookup, []byte("noterm")}, {opWrite, ioBody(1, 0, 100)}, {opSetattr, make([]byte, 10)},
		{opRename2, make([]byte, 12)}, {opCreate, make([]byte, 16)}, {opRead, nil}} {
		if _, e := c.call(tc.op, rootID, tc.body); e != unix.EINVAL {
			t.Errorf("op %d with %d-byte body: %v, want EINVAL", tc.op, len(tc.body), e)
		}
	}
	if _, e := c.call(999, rootID, nil); e != unix.ENOSYS {
		t.Errorf("unknown opcode: %v, want ENOSYS", e)
	}
	if _, err := ParseRequest(make([]byte, 10)); !errors.Is(err, ErrMalformed) {
		t.Errorf("short buffer: %v", err)
	}
}

// TestServerBeforeInit: nothing but INIT is served before INIT.
func TestServerBeforeInit(t *testing.T) {
	s, err := NewServer(t.TempDir(), false)
	must(t, err)
	defer s.Close()
	r := s.Handle(request(opLookup, rootID, 5, 0, cstr("x")), 100)
	if len(r) != outHeaderLen || int32(binary.LittleEndian.Uint32(r[4:])) != -int32(unix.EIO) {
		t.Fatalf("LOOKUP before INIT answered %x", r)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
