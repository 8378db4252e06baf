package task

import (
	"testing"
)

// BenchmarkContainerLifecycle measures the shim's own cost of one
// `ctr run --rm … echo` (Create with real fifos, Start, output, Wait, Delete
// including the VM stop) against the in-process fake VMM and agent: no VM
// boot, no guest.
func BenchmarkContainerLifecycle(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		h := newHarness(b)
		f := h.fifos(false)
		b.StartTimer()
		h.create("c1", []string{"echo", "hi"}, f, nil)
		h.start("c1", "")
		readAll(b, f.stdout)
		h.wait("c1", "")
		h.delete("c1", "")
	}
}
