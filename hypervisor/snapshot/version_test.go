package snapshot

import (
	"errors"
	"testing"
)

func TestVersion(t *testing.T) {
	// Version 1 snapshots record this string (cube-vmm wrote it by hand before
	// it followed Version); it must not change while Version is 1.
	if Version == 1 && VMMVersion() != "cube-vmm/1 state/1" {
		t.Errorf("VMMVersion() = %q, v1 snapshots hold %q", VMMVersion(), "cube-vmm/1 state/1")
	}
	if err := CheckVersion("x", Version); err != nil {
		t.Errorf("CheckVersion(Version): %v", err)
	}
	for _, v := range []uint32{0, Version + 1, 1 << 31} {
		if err := CheckVersion("x state", v); !errors.Is(err, ErrVersion) {
			t.Errorf("CheckVersion(%d): %v, want ErrVersion", v, err)
		}
	}
}
