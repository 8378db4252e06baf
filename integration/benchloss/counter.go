package benchloss

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
)

// Default bounds: lost VMs per sample and in a whole benchmark. The README's rate is about 1 in 12 nested
// boots with a chatty console and rarer with our quiet ones, so three in a row, or more than ten in a run,
// says something else is wrong.
const (
	DefaultPerSample = 3
	DefaultTotal     = 10
)

// ErrBound is what Lost and Sample return (wrapped with the last loss) once a bound is exceeded.
var ErrBound = errors.New("too many lost VMs")

// Counter counts the VMs one benchmark lost and prints each with its evidence. Its zero value is not ready:
// use New (or set Out).
type Counter struct {
	PerSample int       // losses allowed in one sample before it gives up
	Total     int       // losses allowed in all
	Out       io.Writer // where losses and the summary are printed
	Log       func(string)

	lost     []string // one line per loss
	inSample int      // losses in the current sample
	over     error    // set once a bound is exceeded
}

// New is a Counter with the default bounds that prints to stdout (benchmark tables go there) and to tb's log.
func New(tb testing.TB) *Counter {
	return &Counter{PerSample: DefaultPerSample, Total: DefaultTotal, Out: os.Stdout,
		Log: func(s string) { tb.Helper(); tb.Log(strings.TrimRight(s, "\n")) }}
}

func (c *Counter) printf(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	if c.Out != nil {
		fmt.Fprint(c.Out, s)
	}
	if c.Log != nil {
		c.Log(s)
	}
}

// Begin starts a new sample: its count of losses starts again at zero.
func (c *Counter) Begin() { c.inSample = 0 }

// Lost records the failure err of what. A lost VM is counted and printed with its evidence, and Lost returns
// nil while the bounds hold (the caller drops the VM and tries again with a fresh one), or an error wrapping
// ErrBound once they do not. Any other error is returned as is: a real failure, which fails the benchmark.
// Once a bound is exceeded, every further loss returns that error too.
func (c *Counter) Lost(what string, err error) error {
	l, ok := IsLost(err)
	if err == nil || !ok {
		return err
	}
	c.lost = append(c.lost, fmt.Sprintf("%s: %s: %s", what, l.Reason, firstLine(l.Err.Error())))
	c.inSample++
	c.printf("LOST VM %d (%s; left out of the medians): %v\n", len(c.lost), what, err)
	switch {
	case c.over != nil:
	case c.PerSample > 0 && c.inSample > c.PerSample:
		c.over = fmt.Errorf("%w: %s lost %d VMs in a row (bound %d per sample); the last: %v", ErrBound, what, c.inSample, c.PerSample, err)
	case c.Total > 0 && len(c.lost) > c.Total:
		c.over = fmt.Errorf("%w: %d lost in this benchmark (bound %d); the last, %s: %v", ErrBound, len(c.lost), c.Total, what, err)
	}
	return c.over
}

// Sample runs f, which takes one sample with a VM of its own (a fresh one each call), until it succeeds:
// each lost VM is counted (Lost) and f runs again. It returns nil, a real error, or once a bound is exceeded
// an error wrapping ErrBound.
func (c *Counter) Sample(what string, f func() error) error {
	c.Begin()
	for {
		if c.over != nil {
			return c.over
		}
		err := f()
		if err == nil {
			return nil
		}
		if err := c.Lost(what, err); err != nil {
			return err
		}
	}
}

// Stop is what a sample loop does with an error from Sample or Lost: nil goes on (false); a bound exceeded
// stops the loop (true) so the benchmark still prints its table, and Check fails it after; a real error
// fails the benchmark now.
func (c *Counter) Stop(tb testing.TB, err error) bool {
	tb.Helper()
	switch {
	case err == nil:
		return false
	case errors.Is(err, ErrBound):
		return true
	}
	tb.Fatal(err)
	return true
}

// N is the number of VMs lost so far.
func (c *Counter) N() int { return len(c.lost) }

// Summary is the "lost VMs: N" line of a benchmark's table, then one line per loss.
func (c *Counter) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "lost VMs: %d (left out of the medians; bounds %d per sample, %d in all)\n", len(c.lost), c.PerSample, c.Total)
	for _, s := range c.lost {
		fmt.Fprintf(&b, "  %s\n", s)
	}
	return b.String()
}

// Report prints the Summary.
func (c *Counter) Report() { c.printf("%s", c.Summary()) }

// Err is non-nil once a bound was exceeded: the benchmark fails with it after printing its table.
func (c *Counter) Err() error { return c.over }

// Check reports the summary and fails tb if a bound was exceeded. Call it after the table.
func (c *Counter) Check(tb testing.TB) {
	tb.Helper()
	c.Report()
	if c.over != nil {
		tb.Fatal(c.over)
	}
}

// Run takes n samples, Sample("what i", take(i)) for i from 0: a lost VM is retried (take must then use a
// fresh VM), a real error fails tb, and a bound exceeded ends the run early, when Run returns false.
func (c *Counter) Run(tb testing.TB, n int, what string, take func(i int) error) bool {
	tb.Helper()
	for i := range n {
		if c.Stop(tb, c.Sample(fmt.Sprintf("%s %d", what, i+1), func() error { return take(i) })) {
			return false
		}
	}
	return true
}
