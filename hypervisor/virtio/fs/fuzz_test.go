package fs

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// FuzzRequest feeds arbitrary request buffers (opcode, node id, body) to a
// mounted server sharing a directory next to an "outside" directory: no
// panic, every reply is a well-formed out header whose length matches and
// whose unique is the request's, and nothing outside the share changes.
func FuzzRequest(f *testing.F) {
	base := f.TempDir()
	share, outside := filepath.Join(base, "share"), filepath.Join(base, "outside")
	for _, d := range []string{share, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644); err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(share, "f"), []byte("data"), 0o644); err != nil {
		f.Fatal(err)
	}
	if err := os.Symlink("../outside", filepath.Join(share, "out")); err != nil {
		f.Fatal(err)
	}
	c := newClient(f, share, false)
	c.mustLookup(rootID, "f")   // node 2
	c.mustLookup(rootID, "out") // node 3

	f.Add(uint32(opLookup), uint64(1), cstr(".."))
	f.Add(uint32(opLookup), uint64(3), cstr("secret"))
	f.Add(uint32(opCreate), uint64(3), append(make([]byte, 16), cstr("x")...))
	f.Add(uint32(opCreate), uint64(1), append([]byte{1, 0, 0, 0, 0xa4, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, cstr("new")...))
	f.Add(uint32(opWrite), uint64(2), append(ioBody(1, 0, 4), "abcd"...))
	f.Add(uint32(opRead), uint64(2), ioBody(1, 0, 4096))
	f.Add(uint32(opRename2), uint64(1), append(make([]byte, 16), cstr("f", "../g")...))
	f.Add(uint32(opSymlink), uint64(1), cstr("l", "/etc/passwd"))
	f.Add(uint32(opBatchForget), uint64(0), []byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0})
	f.Add(uint32(opSetattr), uint64(2), make([]byte, 88))
	f.Add(uint32(opReaddirplus), uint64(1), ioBody(1, 0, 4096))
	f.Add(uint32(opOpendir), uint64(1), make([]byte, 8))
	f.Add(uint32(opInit), uint64(0), make([]byte, 64))
	f.Fuzz(func(t *testing.T, op uint32, node uint64, body []byte) {
		req := request(op, node, 77, 1000, body)
		r := c.s.Handle(req, 1<<16)
		if r != nil {
			if len(r) < outHeaderLen || binary.LittleEndian.Uint32(r) != uint32(len(r)) ||
				binary.LittleEndian.Uint64(r[8:]) != 77 {
				t.Fatalf("op %d: malformed reply %x", op, r[:min(len(r), 32)])
			}
		}
		// The raw buffer too (lengths that lie).
		c.s.Handle(body, 1<<16)
		if b, err := os.ReadFile(filepath.Join(outside, "secret")); err != nil || string(b) != "secret" {
			t.Fatalf("outside file changed: %q %v", b, err)
		}
		if ents, _ := os.ReadDir(outside); len(ents) != 1 {
			t.Fatalf("outside dir has %d entries", len(ents))
		}
	})
}
