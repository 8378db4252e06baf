package shim

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cube-runtime/cube/integration/cubetest"
)

// Where a `ctr run --rm … true` of io.cube.v1 spends its time, read from
// the shim's and cube-vmm's log lines in containerd's log (docs/shim.md,
// "Benchmarks"): each run's events as offsets from the start of `ctr`, and
// the steps_ms of the shim's and the VMM's step lines. Figures only: no
// assertion depends on them.

// stepEvents are the log lines whose time is an event of a run, in the order
// they happen (the first line containing the text counts).
var stepEvents = []string{
	cubetest.LogRestoring, "restored and running", "sandbox started", "rootfs attached", "container created",
	"process started", "process exited", "container deleted", "sandbox stopped", "shutdown",
}

// stepLines are the log lines with steps_ms (and the VMM's machine_steps_ms,
// and the guest's part, guest_ms, of the agent calls that say).
var stepLines = []string{"sandbox started", "restored and running", "rootfs attached", "container created", "process started", "container deleted", "sandbox stopped"}

// valueFields are log lines with a value worth a median outside steps_ms:
// the agent dials a start needed (shim/sandbox's dialAgent), what the
// shim's Start took (shim/task).
var valueFields = map[string]valueField{
	"agent answered":  newValueField("attempts", "count"),
	"process started": newValueField("took_ms", "ms"),
}

// valueField is a field=number of a log line and its unit.
type valueField struct {
	field, unit string
	re          *regexp.Regexp
}

func newValueField(field, unit string) valueField {
	return valueField{field, unit, regexp.MustCompile(`\b` + field + `=([0-9.]+)`)}
}

// runSteps collects the figures of runs.
type runSteps struct {
	events map[string][]time.Duration // offset from ctr's start
	steps  map[string][]float64       // "line: step" → ms
	end    []time.Duration
	n      int
}

func newRunSteps() *runSteps {
	return &runSteps{events: map[string][]time.Duration{}, steps: map[string][]float64{}}
}

var (
	logTime  = regexp.MustCompile(`^time="([^"]+)"`)
	stepsRe  = regexp.MustCompile(`(machine_steps_ms|steps_ms|guest_ms)=\\?"([^"\\]*)\\?"`)
	stepPair = regexp.MustCompile(`([A-Za-z0-9_-]+)=([0-9.]+)`)
)

// add reads one run's log (containerd's, from the run's start), which began
// at start and took took.
func (r *runSteps) add(log string, start time.Time, took time.Duration) {
	r.n++
	r.end = append(r.end, took)
	seen := map[string]bool{}
	for _, l := range strings.Split(log, "\n") {
		for _, ev := range stepEvents {
			if seen[ev] || !isMsg(l, ev) {
				continue
			}
			if m := logTime.FindStringSubmatch(l); m != nil {
				if t, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
					seen[ev] = true
					r.events[ev] = append(r.events[ev], t.Sub(start))
				}
			}
		}
		for msg, f := range valueFields {
			if !isMsg(l, msg) {
				continue
			}
			if m := f.re.FindStringSubmatch(l); m != nil {
				k := msg + ": " + f.field + " (" + f.unit + ")"
				v, _ := strconv.ParseFloat(m[1], 64)
				r.steps[k] = append(r.steps[k], v)
			}
		}
		for _, sl := range stepLines {
			if !isMsg(l, sl) {
				continue
			}
			for _, m := range stepsRe.FindAllStringSubmatch(l, -1) {
				prefix := sl
				switch m[1] {
				case "machine_steps_ms":
					prefix += " (machine)"
				case "guest_ms":
					prefix += " (guest)"
				}
				for _, p := range stepPair.FindAllStringSubmatch(m[2], -1) {
					if v, err := strconv.ParseFloat(p[2], 64); err == nil {
						k := prefix + ": " + p[1]
						r.steps[k] = append(r.steps[k], v)
					}
				}
			}
		}
	}
}

// isMsg: l is a log line (or a VMM line the shim logged) whose message is msg.
func isMsg(l, msg string) bool {
	return strings.Contains(l, `msg="`+msg+`"`) || strings.Contains(l, `msg=\"`+msg+`\"`)
}

// table prints the medians.
func (r *runSteps) table(name string) string {
	if r.n == 0 {
		return ""
	}
	var t strings.Builder
	fmt.Fprintf(&t, "\n%s: where a run's time goes (median of %d runs; from the shim's and cube-vmm's log lines):\n\n", name, r.n)
	fmt.Fprintf(&t, "| event | ms after ctr started (median) | runs |\n|---|---|---|\n")
	for _, ev := range stepEvents {
		if d := r.events[ev]; len(d) > 0 {
			fmt.Fprintf(&t, "| %s | %.0f | %d |\n", ev, float64(cubetest.Median(d).Microseconds())/1000, len(d))
		}
	}
	fmt.Fprintf(&t, "| ctr exited | %.0f | %d |\n", float64(cubetest.Median(r.end).Microseconds())/1000, len(r.end))
	fmt.Fprintf(&t, "\n| log line: step | ms (median) | runs |\n|---|---|---|\n")
	var keys []string
	for k := range r.steps {
		keys = append(keys, k)
	}
	order := func(k string) int {
		for i, sl := range stepLines {
			if strings.HasPrefix(k, sl) {
				return i
			}
		}
		return len(stepLines)
	}
	// Lines in event order, steps in their first-seen order within a line
	// is not kept by a map: sort by line, then name.
	slices.SortStableFunc(keys, func(a, b string) int {
		if d := order(a) - order(b); d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	for _, k := range keys {
		v := slices.Clone(r.steps[k])
		slices.Sort(v)
		fmt.Fprintf(&t, "| %s | %.2f | %d |\n", k, v[len(v)/2], len(v))
	}
	return t.String()
}
