package fs

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestSessionStateValidate(t *testing.T) {
	good := SessionState{Initialized: true, MaxWrite: 1 << 20, NextID: 3, NextFh: 3,
		Nodes:   []NodeState{{ID: 1, Path: ""}, {ID: 2, Path: "a/b.txt", Lookups: 3}},
		Handles: []HandleState{{FH: 1, Node: 2, Flags: 2}, {FH: 2, Node: 1, Dir: true}}}
	if err := good.Validate(); err != nil {
		t.Fatalf("good session refused: %v", err)
	}
	bad := map[string]func(s *SessionState){
		"dotdot":       func(s *SessionState) { s.Nodes[1].Path = "../etc/passwd" },
		"inner dotdot": func(s *SessionState) { s.Nodes[1].Path = "a/../../x" },
		"absolute":     func(s *SessionState) { s.Nodes[1].Path = "/etc/passwd" },
		"nul":          func(s *SessionState) { s.Nodes[1].Path = "a\x00b" },
		"long":         func(s *SessionState) { s.Nodes[1].Path = strings.Repeat("a", maxPath+1) },
		"dup node":     func(s *SessionState) { s.Nodes[1].ID = 1 },
		"zero node":    func(s *SessionState) { s.Nodes[1].ID = 0 },
		"dup fh":       func(s *SessionState) { s.Handles[1].FH = 1 },
		"dangling fh":  func(s *SessionState) { s.Handles[0].Node = 99 },
		"lookups":      func(s *SessionState) { s.Nodes[1].Lookups = 1 << 62 },
		"id past next": func(s *SessionState) { s.NextID = 2 },
		"fh past next": func(s *SessionState) { s.NextFh = 2 },
		"huge count":   func(s *SessionState) { s.Handles = make([]HandleState, maxSessionHandles+1) },
		"root path":    func(s *SessionState) { s.Nodes[0].Path = "a" },
		"root stale":   func(s *SessionState) { s.Nodes[0].Stale = true },
		"stale path":   func(s *SessionState) { s.Nodes[1].Stale = true },
		"empty path":   func(s *SessionState) { s.Nodes[1].Path = "" },
		"no lookups":   func(s *SessionState) { s.Nodes[1].Lookups = 0 },
		"next id root": func(s *SessionState) { s.NextID, s.Nodes = 1, s.Nodes[:0] },
		"next id wrap": func(s *SessionState) { s.NextID = 1 << 63 },
		"next fh zero": func(s *SessionState) { s.NextFh, s.Handles = 0, nil },
		"open flags":   func(s *SessionState) { s.Handles[0].Flags = unix.O_PATH },
		"accmode 3":    func(s *SessionState) { s.Handles[0].Flags = unix.O_ACCMODE },
		"components": func(s *SessionState) {
			deep := strings.Repeat("a/", maxPath/2-1) + "a"
			s.NextID = MaxInodes + 2
			for id := uint64(3); id < MaxInodes+2; id++ {
				s.Nodes = append(s.Nodes, NodeState{ID: id, Path: deep, Lookups: 1})
			}
		},
	}
	for name, mut := range bad {
		s := good
		s.Nodes = append([]NodeState(nil), good.Nodes...)
		s.Handles = append([]HandleState(nil), good.Handles...)
		mut(&s)
		if err := s.Validate(); !errors.Is(err, errBadSession) {
			t.Errorf("%s: got %v, want errBadSession", name, err)
		}
	}
}

// FuzzStateRestore restores arbitrary sessions (as a snapshot file's JSON)
// into a server sharing a directory beside an "outside" one reached by a
// symlink in the share: a session Validate refuses leaves the server's own
// session serving; one it accepts opens nothing outside the share (no
// node's and no handle's host file is an outside one), and the server
// serves requests on every node id after it without a panic.
func FuzzStateRestore(f *testing.F) {
	f.Add([]byte(`{"Initialized":true,"NextID":3,"NextFh":2,"Nodes":[{"ID":1,"Path":""},{"ID":2,"Path":"a","Lookups":1}],"Handles":[{"FH":1,"Node":2}]}`))
	f.Add([]byte(`{"Initialized":true,"NextID":5,"NextFh":3,"Nodes":[{"ID":2,"Path":"out/secret","Lookups":1},{"ID":3,"Path":"out","Lookups":1},{"ID":4,"Path":"d/f","Lookups":2}],"Handles":[{"FH":1,"Node":2},{"FH":2,"Node":4,"Flags":2}]}`))
	f.Add([]byte(`{"Initialized":true,"NextID":4,"NextFh":2,"Nodes":[{"ID":2,"Stale":true,"Lookups":1},{"ID":3,"Path":"d","Lookups":1}],"Handles":[{"FH":1,"Node":3,"Dir":true,"Flags":65536}]}`))
	f.Add([]byte(`{"Nodes":[{"ID":2,"Path":"../x"}]}`))
	base := f.TempDir()
	share, outside := filepath.Join(base, "share"), filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(share, "d"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			f.Fatal(err)
		}
	}
	for p, data := range map[string]string{filepath.Join(outside, "secret"): "secret", filepath.Join(share, "a"): "a",
		filepath.Join(share, "d", "f"): "f"} {
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.Symlink("../outside", filepath.Join(share, "out")); err != nil {
		f.Fatal(err)
	}
	outsideKeys := map[inodeKey]bool{}
	for _, p := range []string{outside, filepath.Join(outside, "secret")} {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			f.Fatal(err)
		}
		outsideKeys[keyOf(&st)] = true
	}
	c := newClient(f, share, false)
	c.mustLookup(rootID, "a") // a live session to come back to
	f.Fuzz(func(t *testing.T, b []byte) {
		c.t = t
		before := c.s.Session()
		var s SessionState
		if json.Unmarshal(b, &s) != nil {
			return
		}
		if err := c.s.Restore(&s); err != nil {
			if s.Validate() == nil {
				t.Fatalf("a valid session refused: %v", err)
			}
			if got := c.s.Session(); !reflect.DeepEqual(got, before) {
				t.Fatalf("a refused restore changed the session")
			}
			return
		}
		for id, n := range c.s.inodes {
			if n.fd >= 0 {
				st, err := fstat(n.fd)
				if err != nil || outsideKeys[keyOf(&st)] {
					t.Fatalf("node %d (%q) is outside the share (%v)", id, n.path, err)
				}
			}
			c.getattr(id)
		}
		for fh, h := range c.s.handles {
			st, err := fstat(h.fd)
			if err != nil || outsideKeys[keyOf(&st)] {
				t.Fatalf("handle %d is outside the share (%v)", fh, err)
			}
		}
		// Back to a known session for the next input.
		if err := c.s.Restore(before); err != nil {
			t.Fatal(err)
		}
	})
}
