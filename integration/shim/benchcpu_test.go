package shim

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/procacct"
)

// runCPU tallies the test host's CPU by process over BenchmarkCtrRunTrue's
// timed runs, per variant (integration/procacct: process accounting for
// the processes that exited, /proc for those still running). On one vCPU a
// run's wall time is nearly all CPU, so this says whose work the gap is.
type runCPU struct {
	off    string // why there is no table (accounting unavailable)
	byName map[string]map[string]time.Duration
	idle   map[string]time.Duration
	runs   map[string]int
}

func newRunCPU() *runCPU {
	return &runCPU{byName: map[string]map[string]time.Duration{}, idle: map[string]time.Duration{}, runs: map[string]int{}}
}

// measure runs f with accounting on and adds its usage to variant. Once
// accounting fails the tally says why and f runs bare.
func (c *runCPU) measure(b *testing.B, variant string, f func() error) error {
	if c.off != "" {
		return f()
	}
	rec, err := procacct.Start(b.TempDir())
	if err != nil {
		c.off = err.Error()
		b.Logf("no CPU by process: %v", err)
		return f()
	}
	ferr := f()
	u, err := rec.Stop()
	if err != nil {
		c.off = err.Error()
		b.Logf("no CPU by process: %v", err)
		return ferr
	}
	if ferr != nil {
		return ferr // a failed run is not counted
	}
	if c.byName[variant] == nil {
		c.byName[variant] = map[string]time.Duration{}
	}
	for n, d := range u.ByName {
		if strings.HasPrefix(n, "kworker/") {
			// A kworker's name carries the work queue it last ran.
			n = "kworkers"
		}
		c.byName[variant][n] += d
	}
	c.idle[variant] += u.Idle
	c.runs[variant]++
	return nil
}

// table is the mean CPU per run by process for each variant measured
// (processes under 5 ms a run everywhere are summed as "other").
func (c *runCPU) table(variants []string) string {
	if c.off != "" {
		return fmt.Sprintf("\ntest host CPU by process: not measured (%s)\n", c.off)
	}
	var vs []string
	for _, v := range variants {
		if c.runs[v] > 0 {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return ""
	}
	mean := func(v, n string) time.Duration { return c.byName[v][n] / time.Duration(c.runs[v]) }
	shown := map[string]bool{}
	for _, v := range vs {
		for n := range c.byName[v] {
			if mean(v, n) >= 5*time.Millisecond {
				shown[n] = true
			}
		}
	}
	names := make([]string, 0, len(shown))
	for n := range shown {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int {
		return cmp.Or(cmp.Compare(mean(vs[0], b), mean(vs[0], a)), strings.Compare(a, b))
	})
	var t strings.Builder
	fmt.Fprintf(&t, "\ntest host CPU per run by process (ms, mean; process accounting for the processes that exited, /proc for those running):\n\n")
	fmt.Fprintf(&t, "| process | %s |\n|---|%s\n", strings.Join(vs, " | "), strings.Repeat("---|", len(vs)))
	row := func(label string, f func(v string) time.Duration) {
		fmt.Fprintf(&t, "| %s |", label)
		for _, v := range vs {
			fmt.Fprintf(&t, " %d |", f(v).Milliseconds())
		}
		t.WriteString("\n")
	}
	for _, n := range names {
		row(n, func(v string) time.Duration { return mean(v, n) })
	}
	row("other", func(v string) time.Duration {
		var o time.Duration
		for n := range c.byName[v] {
			if !shown[n] {
				o += mean(v, n)
			}
		}
		return o
	})
	row("all", func(v string) time.Duration {
		var a time.Duration
		for n := range c.byName[v] {
			a += mean(v, n)
		}
		return a
	})
	row("test host idle", func(v string) time.Duration { return c.idle[v] / time.Duration(c.runs[v]) })
	fmt.Fprintf(&t, "(runs: %s)\n", func() string {
		var p []string
		for _, v := range vs {
			p = append(p, fmt.Sprintf("%s %d", v, c.runs[v]))
		}
		return strings.Join(p, ", ")
	}())
	return t.String()
}
