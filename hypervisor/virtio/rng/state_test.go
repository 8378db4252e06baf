package rng_test

import (
	"testing"

	"github.com/cube-runtime/cube/hypervisor/snapshot/snapshottest"
	"github.com/cube-runtime/cube/hypervisor/virtio/rng"
)

func TestState(t *testing.T) {
	snapshottest.RoundTrip(t, rng.Kind, rng.New(), rng.New())
	snapshottest.Encoding(t, `{"Version":1}`, &rng.State{})
	snapshottest.Refusals(t, rng.New(), `{"Version":2}`)
}

func FuzzRestoreState(f *testing.F) {
	snapshottest.Fuzz(f, rng.New())
}
