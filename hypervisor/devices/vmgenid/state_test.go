package vmgenid

import (
	"bytes"
	"errors"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/hypervisor/snapshot/snapshottest"
)

func TestState(t *testing.T) {
	from, _, _ := newTest(t, seq(0xa0, 16))
	if err := from.Generate(); err != nil {
		t.Fatal(err)
	}
	to, mem, log := newTest(t, nil)
	snapshottest.RoundTrip(t, Kind, from, to)
	if to.ID() != from.ID() {
		t.Errorf("restored id %x, saved %x", to.ID(), from.ID())
	}
	if len(*log) != 0 || !bytes.Equal(mem.b, make([]byte, len(mem.b))) {
		t.Errorf("RestoreState touched guest memory or the interrupt: %q", *log)
	}
	snapshottest.Encoding(t, `{"Version":1,"Addr":1040384,"GSI":5,"ID":"a0a1a2a3a4a5a6a7a8a9aaabacadaeaf"}`, &State{})
	snapshottest.Refusals(t, to, `{"Version":99,"Addr":1040384,"GSI":5,"ID":"a0a1a2a3a4a5a6a7a8a9aaabacadaeaf"}`)
	for _, c := range []struct {
		state string
		want  error
	}{
		{`{"Version":1,"Addr":1044480,"GSI":5,"ID":"a0a1a2a3a4a5a6a7a8a9aaabacadaeaf"}`, snapshot.ErrMismatch},
		{`{"Version":1,"Addr":1040384,"GSI":6,"ID":"a0a1a2a3a4a5a6a7a8a9aaabacadaeaf"}`, snapshot.ErrMismatch},
		{`{"Version":1,"Addr":1040384,"GSI":5,"ID":"a0a1"}`, snapshot.ErrCorrupt},
		{`{"Version":1,"Addr":1040384,"GSI":5,"ID":"zz"}`, snapshot.ErrCorrupt},
		{`{"Version":1,"Addr":1040384,"GSI":5}`, snapshot.ErrCorrupt},
	} {
		if err := to.RestoreState([]byte(c.state)); !errors.Is(err, c.want) {
			t.Errorf("RestoreState(%s): %v, want %v", c.state, err, c.want)
		}
	}
	if to.ID() != from.ID() {
		t.Errorf("a refused state changed the id to %x", to.ID())
	}
}

func FuzzRestoreState(f *testing.F) {
	d, _, _ := newTest(f, nil)
	snapshottest.Fuzz(f, d)
}
