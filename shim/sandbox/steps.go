package sandbox

import (
	"time"

	"github.com/cube-runtime/cube/hypervisor/steps"
)

// Steps times the steps of one operation for its log line (steps_ms), in
// cube-vmm's own format: it is the VMM's type (package steps), so one
// parser reads the shim's and the VMM's lines.
type Steps = steps.Steps

// NewSteps starts timing at t0.
func NewSteps(t0 time.Time) *Steps { return steps.New(t0) }

// MS is d in milliseconds, to two decimals, for log fields.
func MS(d time.Duration) float64 { return steps.MS(d) }
