package fs

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
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

func FuzzStateRestore(f *testing.F) {
	f.Add([]byte(`{"Initialized":true,"NextID":3,"NextFh":2,"Nodes":[{"ID":1,"Path":""},{"ID":2,"Path":"a"}],"Handles":[{"FH":1,"Node":2}]}`))
	f.Add([]byte(`{"Nodes":[{"ID":2,"Path":"../x"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var s SessionState
		if json.Unmarshal(b, &s) != nil {
			return
		}
		if s.Validate() != nil {
			return
		}
		for _, n := range s.Nodes {
			if strings.HasPrefix(n.Path, "/") || strings.Contains("/"+n.Path+"/", "/../") {
				t.Fatalf("escaping path accepted: %q", n.Path)
			}
		}
	})
}
