// Package steps times the steps of one operation for its log line
// (steps_ms="open=0.12 vm=3.40 …", milliseconds). cube-vmm and the shim
// both log with it, so one parser reads both (BenchmarkCtrRunTrue's step
// tables). It imports nothing of ours.
package steps

import (
	"fmt"
	"strings"
	"sync"
	"time"
)

// Steps records consecutive steps: each Mark ends the step named, counted
// from the previous Mark (or the start). Safe for concurrent use; a nil
// *Steps ignores everything, so code shared with operations that are not
// timed can mark unconditionally.
type Steps struct {
	mu    sync.Mutex
	start time.Time
	last  time.Time
	names []string
	took  []time.Duration
}

// New starts timing at t0.
func New(t0 time.Time) *Steps { return &Steps{start: t0, last: t0} }

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
		fmt.Fprintf(&b, "%s=%.2f", n, MS(s.took[i]))
	}
	return b.String()
}

// MS is d in milliseconds, to two decimals, for log fields.
func MS(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
