package sandbox

import (
	"fmt"
	"strings"
	"sync"
	"time"
)

// Steps times the steps of one operation for its log line (steps_ms):
// each Mark ends the step named, counted from the previous Mark (or the
// start). The format is cube-vmm's own ("open=0.12 vm=3.40 …", in
// milliseconds), so one parser reads the shim's and the VMM's lines.
// Safe for concurrent use; a nil *Steps ignores everything.
type Steps struct {
	mu    sync.Mutex
	start time.Time
	last  time.Time
	names []string
	took  []time.Duration
}

// NewSteps starts timing at t0.
func NewSteps(t0 time.Time) *Steps { return &Steps{start: t0, last: t0} }

// Mark ends the step called name.
func (s *Steps) Mark(name string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	s.names = append(s.names, name)
	s.took = append(s.took, now.Sub(s.last))
	s.last = now
}

// Total is the time from the start to the last Mark.
func (s *Steps) Total() time.Duration {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last.Sub(s.start)
}

// String lists the steps in order, in milliseconds: "vmm=3.40 agent=1.20".
func (s *Steps) String() string {
	if s == nil {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for i, n := range s.names {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%.2f", n, float64(s.took[i].Microseconds())/1000)
	}
	return b.String()
}

// MS is d in milliseconds, to two decimals, for log fields.
func MS(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
