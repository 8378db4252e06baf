// Package report reads critest's (ginkgo's) JUnit report and the skip list of integration/critest, and
// compares a Cube run with a runc run: counts side by side, and the specs Cube fails that runc passes.
package report

import (
	"bufio"
	"encoding/xml"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
)

// Status of one spec.
type Status string

const (
	Passed  Status = "passed"
	Failed  Status = "failed"
	Skipped Status = "skipped"
)

// Spec is one spec of a run: its full text (describe blocks and It, without ginkgo's "[It] " and labels
// such as "[Conformance]" kept as they are), status and failure message.
type Spec struct {
	Name    string
	Status  Status
	Message string
	Seconds float64 // how long it ran (informational)
}

// Run is a critest run's specs by name, and the suite-level failures (BeforeSuite, AfterSuite…).
type Run struct {
	Specs       map[string]Spec
	SuiteErrors []string
}

type junit struct {
	Suites []struct {
		Cases []struct {
			Name    string  `xml:"name,attr"`
			Status  string  `xml:"status,attr"`
			Time    float64 `xml:"time,attr"`
			Failure *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"failure"`
			Error *struct {
				Message string `xml:"message,attr"`
			} `xml:"error"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// ParseJUnit reads ginkgo v2's JUnit report (--ginkgo.junit-report).
func ParseJUnit(r io.Reader) (*Run, error) {
	var j junit
	if err := xml.NewDecoder(r).Decode(&j); err != nil {
		return nil, fmt.Errorf("parse JUnit report: %w", err)
	}
	run := &Run{Specs: map[string]Spec{}}
	for _, s := range j.Suites {
		for _, c := range s.Cases {
			st := Status(c.Status)
			switch {
			case c.Failure != nil || c.Error != nil:
				st = Failed
			case c.Skipped != nil || st == "pending":
				st = Skipped
			case st == "":
				st = Passed
			}
			if st != Passed && st != Skipped {
				st = Failed // failed, panicked, interrupted, timedout, aborted
			}
			msg := ""
			switch {
			case c.Failure != nil:
				msg = strings.TrimSpace(c.Failure.Message)
			case c.Error != nil:
				msg = strings.TrimSpace(c.Error.Message)
			case c.Skipped != nil:
				msg = strings.TrimSpace(c.Skipped.Message)
			}
			name, isIt := strings.CutPrefix(c.Name, "[It] ")
			if !isIt {
				if st == Failed {
					run.SuiteErrors = append(run.SuiteErrors, c.Name+": "+msg)
				}
				continue
			}
			run.Specs[name] = Spec{Name: name, Status: st, Message: msg, Seconds: c.Time}
		}
	}
	return run, nil
}

// Count is a run's passed, failed and skipped specs; NotSelected are the skipped ones the run left out
// (outside its --ginkgo.focus, or critest's default skip of benchmarks), which ginkgo reports as "skipped"
// like the skip list's entries; a spec that skipped itself says why ("skipped - <why>").
type Count struct{ Passed, Failed, Skipped, NotSelected int }

// Count counts r's specs; focus (the run's --ginkgo.focus, "" for all) and skips (for cube, or the [all]
// entries) tell the skip list's plain skips from the specs the run did not select.
func (r *Run) Count(skips SkipList, cube bool, focus string) Count {
	var c Count
	fre, err := regexp.Compile(focus)
	if err != nil {
		fre = regexp.MustCompile("")
	}
	for _, s := range r.Specs {
		switch s.Status {
		case Passed:
			c.Passed++
		case Failed:
			c.Failed++
		default:
			if _, listed := skips.Match(s.Name, cube); s.Message == "skipped" && (!listed || !fre.MatchString(s.Name)) {
				c.NotSelected++
			} else {
				c.Skipped++
			}
		}
	}
	return c
}

// SkipEntry is one line of the skip list: a regular expression over spec names and why.
type SkipEntry struct {
	Pattern *regexp.Regexp
	Reason  string
	// All: skipped for every handler (the test host cannot run it), not only for cube.
	All  bool
	Line int
}

// SkipList is the skip list file: one regular expression per line (matched against the spec's full text),
// then `# reason`. Lines under `[all]` are skipped for runc and cube (what the test host or the local images
// cannot do); lines under `[cube]` for cube only (what Cube does not do yet). Blank lines and lines starting
// with # are comments. Every entry needs a reason.
type SkipList []SkipEntry

func ParseSkipList(r io.Reader) (SkipList, error) {
	var l SkipList
	section := ""
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if line == "[all]" || line == "[cube]" {
			section = strings.Trim(line, "[]")
			continue
		}
		if section == "" {
			return nil, fmt.Errorf("skip list line %d: entry before a [all] or [cube] section", n)
		}
		pat, reason, ok := strings.Cut(line, " # ")
		pat, reason = strings.TrimSpace(pat), strings.TrimSpace(reason)
		if !ok || reason == "" {
			return nil, fmt.Errorf("skip list line %d: no `# reason`", n)
		}
		re, err := regexp.Compile(pat)
		if err != nil {
			return nil, fmt.Errorf("skip list line %d: %w", n, err)
		}
		l = append(l, SkipEntry{Pattern: re, Reason: reason, All: section == "all", Line: n})
	}
	return l, sc.Err()
}

// Regexp is the entries for handler ("cube": all of them; otherwise the [all] ones) as one alternation, for
// critest's --ginkgo.skip; "" when none.
func (l SkipList) Regexp(cube bool) string {
	var parts []string
	for _, e := range l {
		if e.All || cube {
			parts = append(parts, "(?:"+e.Pattern.String()+")")
		}
	}
	return strings.Join(parts, "|")
}

// Match is the first entry matching spec (for cube: any; else [all] only).
func (l SkipList) Match(spec string, cube bool) (SkipEntry, bool) {
	for _, e := range l {
		if (e.All || cube) && e.Pattern.MatchString(spec) {
			return e, true
		}
	}
	return SkipEntry{}, false
}

// Unused is the entries that match none of names (stale lines of the list).
func (l SkipList) Unused(names []string) []SkipEntry {
	var out []SkipEntry
	for _, e := range l {
		used := false
		for _, n := range names {
			if e.Pattern.MatchString(n) {
				used = true
				break
			}
		}
		if !used {
			out = append(out, e)
		}
	}
	return out
}

// Comparison is runc's and cube's runs of the same specs.
type Comparison struct {
	Runc, Cube *Run
	Skips      SkipList
	Focus      string // the runs' --ginkgo.focus ("" for the whole suite)
	// Regressions: cube failed (or did not run: a missing spec) what runc passed, and no skip entry covers it.
	Regressions []Spec
	// BothFail: failed on both (the test host or the images, not Cube's doing).
	BothFail []string
	// CubeOnlyPass: cube passed what runc failed.
	CubeOnlyPass []string
}

func Compare(runc, cube *Run, skips SkipList, focus string) Comparison {
	c := Comparison{Runc: runc, Cube: cube, Skips: skips, Focus: focus}
	for _, name := range sortedNames(runc) {
		r := runc.Specs[name]
		k, ok := cube.Specs[name]
		if !ok {
			k = Spec{Name: name, Status: Failed, Message: "not in cube's report"}
		}
		switch {
		case r.Status == Passed && k.Status == Failed:
			if _, skipped := skips.Match(name, true); !skipped {
				c.Regressions = append(c.Regressions, k)
			}
		case r.Status == Passed && k.Status == Skipped:
			if _, skipped := skips.Match(name, true); !skipped {
				// critest skipped it for cube by itself (e.g. a feature the runtime handler reports it lacks).
				k.Message = "skipped by critest for cube only: " + k.Message
				c.Regressions = append(c.Regressions, k)
			}
		case r.Status == Failed && k.Status == Failed:
			c.BothFail = append(c.BothFail, name)
		case r.Status == Failed && k.Status == Passed:
			c.CubeOnlyPass = append(c.CubeOnlyPass, name)
		}
	}
	return c
}

func sortedNames(r *Run) []string {
	names := make([]string, 0, len(r.Specs))
	for n := range r.Specs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Table is the counts side by side and the lists of differences, for the test's log.
func (c Comparison) Table() string {
	var b strings.Builder
	rc, kc := c.Runc.Count(c.Skips, false, c.Focus), c.Cube.Count(c.Skips, true, c.Focus)
	fmt.Fprintf(&b, "%-8s %7s %7s %8s %13s\n", "handler", "passed", "failed", "skipped", "not selected")
	fmt.Fprintf(&b, "%-8s %7d %7d %8d %13d\n", "runc", rc.Passed, rc.Failed, rc.Skipped, rc.NotSelected)
	fmt.Fprintf(&b, "%-8s %7d %7d %8d %13d\n", "cube", kc.Passed, kc.Failed, kc.Skipped, kc.NotSelected)
	list := func(title string, names []string) {
		if len(names) > 0 {
			fmt.Fprintf(&b, "%s (%d):\n", title, len(names))
			for _, n := range names {
				fmt.Fprintf(&b, "  %s\n", n)
			}
		}
	}
	list("failed on runc and cube", c.BothFail)
	list("passed on cube, failed on runc", c.CubeOnlyPass)
	var reg []string
	for _, s := range c.Regressions {
		reg = append(reg, s.Name+"\n      "+firstLine(s.Message))
	}
	list("REGRESSIONS: passed on runc, not on cube, not in the skip list", reg)
	return b.String()
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// Durations lists r's specs that ran with their seconds, longest first (informational: where the time went).
func (r *Run) Durations() string {
	var specs []Spec
	for _, s := range r.Specs {
		if s.Status != Skipped {
			specs = append(specs, s)
		}
	}
	sort.Slice(specs, func(i, j int) bool { return specs[i].Seconds > specs[j].Seconds })
	var b strings.Builder
	for _, s := range specs {
		fmt.Fprintf(&b, "%7.1fs %-7s %s\n", s.Seconds, s.Status, s.Name)
	}
	return b.String()
}
