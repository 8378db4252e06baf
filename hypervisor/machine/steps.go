package machine

import (
	"fmt"
	"strings"
	"time"
)

// Steps times the consecutive steps of one operation (a restore) for its
// log line: each Mark records the time since the previous one. A nil
// *Steps does nothing, so code shared with other operations (New,
// Rollback) can mark unconditionally.
type Steps struct {
	last  time.Time
	names []string
	took  []time.Duration
}

// NewSteps starts timing at t0.
func NewSteps(t0 time.Time) *Steps { return &Steps{last: t0} }

// Mark ends the step called name.
func (s *Steps) Mark(name string) {
	if s == nil {
		return
	}
	now := time.Now()
	s.names = append(s.names, name)
	s.took = append(s.took, now.Sub(s.last))
	s.last = now
}

// String lists the steps in order, in milliseconds: "open=0.12 vm=3.40 …".
func (s *Steps) String() string {
	if s == nil {
		return ""
	}
	var b strings.Builder
	for i, n := range s.names {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%.2f", n, float64(s.took[i].Microseconds())/1000)
	}
	return b.String()
}
