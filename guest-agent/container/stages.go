package container

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// monotonicNS is CLOCK_MONOTONIC in nanoseconds: one clock for the agent
// and the helper it forks, so the agent can tell how long the helper took
// to reach its main.
func monotonicNS() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}

// nsMS is a duration in nanoseconds in milliseconds.
func nsMS(ns int64) float64 { return float64(ns) / 1e6 }

// stages times the helper's steps for the agent's log ("config=0.4
// rootfs=12.1 …", ms).
type stages struct {
	last int64
	b    strings.Builder
}

func newStages(t0 int64) *stages { return &stages{last: t0} }

func (s *stages) mark(name string) {
	now := monotonicNS()
	if s.b.Len() > 0 {
		s.b.WriteByte(' ')
	}
	fmt.Fprintf(&s.b, "%s=%.1f", name, nsMS(now-s.last))
	s.last = now
}

func (s *stages) String() string { return s.b.String() }
