// Package snapshottest has the checks every device's state test makes (a
// round trip through snapshot.Device, the version 1 encoding of its state,
// refusals, a fuzz target) and the golden snapshot's files.
package snapshottest

import (
	"bytes"
	"errors"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// RoundTrip saves from's state, restores it into to (a device built like
// from), and checks that to then saves the same bytes and both are of kind.
func RoundTrip(t testing.TB, kind string, from, to snapshot.Device) {
	t.Helper()
	if from.StateKind() != kind || to.StateKind() != kind {
		t.Fatalf("kinds %q and %q, want %q", from.StateKind(), to.StateKind(), kind)
	}
	b, err := from.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	if err := to.RestoreState(b); err != nil {
		t.Fatalf("restore a state just saved: %v", err)
	}
	again, err := to.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, b) {
		t.Errorf("restored device saves\n%s\nit was given\n%s", again, b)
	}
}

// Encoding decodes a state written in the format's encoding (a literal of the
// version the test names) into v and checks that it encodes to the same
// bytes: a field renamed, retyped or dropped fails here.
func Encoding(t testing.TB, encoded string, v any) {
	t.Helper()
	if err := snapshot.Load([]byte(encoded), v); err != nil {
		t.Fatal(err)
	}
	b, err := snapshot.Save(v)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != encoded {
		t.Errorf("state encodes as\n%s\nthe snapshot format has\n%s\n(changing a state's encoding is a snapshot.Version bump)", b, encoded)
	}
}

// Refusals checks that d refuses malformed input as snapshot.ErrCorrupt and,
// if otherVersion is not empty, a state of another version as
// snapshot.ErrVersion.
func Refusals(t testing.TB, d snapshot.Device, otherVersion string) {
	t.Helper()
	for _, b := range []string{"", "[", "[]", `"a string"`, "null x"} {
		if err := d.RestoreState([]byte(b)); !errors.Is(err, snapshot.ErrCorrupt) {
			t.Errorf("RestoreState(%q): %v, want ErrCorrupt", b, err)
		}
	}
	if otherVersion != "" {
		if err := d.RestoreState([]byte(otherVersion)); !errors.Is(err, snapshot.ErrVersion) {
			t.Errorf("RestoreState(%s): %v, want ErrVersion", otherVersion, err)
		}
	}
}

// Fuzz feeds d's RestoreState arbitrary input, seeded with its own state:
// it must not panic, and what it accepts it must save again.
func Fuzz(f *testing.F, d snapshot.Device) {
	seed, err := d.SaveState()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte("{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := d.RestoreState(b); err != nil {
			return
		}
		if _, err := d.SaveState(); err != nil {
			t.Fatalf("accepted %q, then cannot save: %v", b, err)
		}
	})
}
