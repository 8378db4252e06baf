package machine

import (
	"time"

	"github.com/cube-runtime/cube/hypervisor/steps"
)

// Steps times the consecutive steps of one operation (a restore) for its
// log line (package steps). A nil *Steps does nothing, so code shared with
// other operations (New, Rollback) can mark unconditionally.
type Steps = steps.Steps

// NewSteps starts timing at t0.
func NewSteps(t0 time.Time) *Steps { return steps.New(t0) }
