package store

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestToken(t *testing.T) {
	snap := Snapshot{ID: "0123456789abcdef01234567", Created: testTime}
	pos, err := parseToken(makeToken(snap))
	if err != nil || pos.created != testTime.UnixNano() || pos.id != snap.ID {
		t.Errorf("%+v %v", pos, err)
	}
	for _, bad := range []string{"x", "djE6", "djE6MTI6eHg", strings.Repeat("A", 200)} {
		if _, err := parseToken(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
