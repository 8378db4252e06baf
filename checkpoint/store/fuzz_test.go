package store

import (
	"reflect"
	"testing"
)

// FuzzParseMetadata feeds the same bytes to the parsers of the three
// metadata files (snapshot, pending record, reference): each refuses or
// accepts, never panics, and what it accepts is valid (ids usable as path
// components) and survives encoding and parsing again unchanged.
func FuzzParseMetadata(f *testing.F) {
	e := testEntry()
	f.Add(mustEncode(f, e))
	owner := testOwner()
	e.Op, e.Owner, e.Kind, e.Parent = "fork-1", &owner, Full, ""
	f.Add(mustEncode(f, e))
	f.Add(mustEncode(f, testPending()))
	f.Add(mustEncode(f, testRef()))
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{"version":2}`))
	f.Add([]byte(`{"version":1,"id":"0123456789abcdef01234567","kind":"full","created":"2026-01-01T00:00:00Z","sandbox":"\u0000"}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if e, err := parseEntry(b); err == nil {
			if !isID(e.ID) || e.Parent != "" && !isID(e.Parent) {
				t.Fatalf("accepted ids %q %q", e.ID, e.Parent)
			}
			again, err := parseEntry(mustEncode(t, e))
			if err != nil || !reflect.DeepEqual(again, e) {
				t.Fatalf("entry %+v does not survive a round trip: %+v %v", e, again, err)
			}
		}
		if p, err := parsePending(b); err == nil {
			for _, n := range p.Names {
				if checkName("name", n) != nil {
					t.Fatalf("accepted name %q", n)
				}
			}
			again, err := parsePending(mustEncode(t, p))
			if err != nil || !reflect.DeepEqual(again, p) {
				t.Fatalf("pending %+v does not survive a round trip: %+v %v", p, again, err)
			}
		}
		if r, err := parseRef(b); err == nil {
			again, err := parseRef(mustEncode(t, r))
			if err != nil || !reflect.DeepEqual(again, r) {
				t.Fatalf("reference %+v does not survive a round trip: %+v %v", r, again, err)
			}
		}
	})
}
