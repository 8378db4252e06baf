package report

import (
	"strings"
	"testing"
)

const sample = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="6" disabled="1" errors="0" failures="2" time="10">
  <testsuite name="CRI validation" package="/tmp" tests="6" disabled="1" skipped="1" errors="0" failures="2" time="10">
    <testcase name="[BeforeSuite]" classname="CRI validation" status="passed" time="0"></testcase>
    <testcase name="[It] [k8s.io] PodSandbox runtime should support running PodSandbox [Conformance]" classname="CRI validation" status="passed" time="1"></testcase>
    <testcase name="[It] [k8s.io] Container OOM runtime should output OOMKilled reason" classname="CRI validation" status="failed" time="2">
      <failure message="Expected 137&#xA;got 0" type="failed">[FAILED] Expected 137</failure>
    </testcase>
    <testcase name="[It] [k8s.io] Streaming runtime should support attach [Conformance]" classname="CRI validation" status="timedout" time="2">
      <failure message="timed out" type="timedout">…</failure>
    </testcase>
    <testcase name="[It] [k8s.io] Image benchmark about listing Image" classname="CRI validation" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
    <testcase name="[It] [k8s.io] NRI pod sandbox lifecycle" classname="CRI validation" status="skipped" time="0">
      <skipped message="skipped - NRI socket not set"></skipped>
    </testcase>
  </testsuite>
</testsuites>`

func TestParseJUnit(t *testing.T) {
	r, err := ParseJUnit(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Specs) != 5 || len(r.SuiteErrors) != 0 {
		t.Fatalf("specs %d suite errors %v, want 5 and none", len(r.Specs), r.SuiteErrors)
	}
	oom := r.Specs["[k8s.io] Container OOM runtime should output OOMKilled reason"]
	if oom.Status != Failed || oom.Message != "Expected 137\ngot 0" {
		t.Errorf("OOM spec %+v", oom)
	}
	if s := r.Specs["[k8s.io] Streaming runtime should support attach [Conformance]"]; s.Status != Failed {
		t.Errorf("a timed-out spec is %q, want failed", s.Status)
	}
	if got, want := r.Count(nil, true, ""), (Count{Passed: 1, Failed: 2, Skipped: 1, NotSelected: 1}); got != want {
		t.Errorf("count %+v, want %+v", got, want)
	}
	// A skip list entry counts as skipped inside the focus, as not selected outside it.
	skips, _ := ParseSkipList(strings.NewReader("[all]\nbenchmark # not here\n"))
	if got, want := r.Count(skips, false, ""), (Count{Passed: 1, Failed: 2, Skipped: 2}); got != want {
		t.Errorf("count with a skip list %+v, want %+v", got, want)
	}
	if got, want := r.Count(skips, false, "PodSandbox|OOM"), (Count{Passed: 1, Failed: 2, Skipped: 1, NotSelected: 1}); got != want {
		t.Errorf("count with a skip list outside the focus %+v, want %+v", got, want)
	}
	bad := strings.Replace(sample, `name="[BeforeSuite]" classname="CRI validation" status="passed" time="0">`,
		`name="[BeforeSuite]" classname="CRI validation" status="failed" time="0"><failure message="no runtime">x</failure>`, 1)
	if r, err := ParseJUnit(strings.NewReader(bad)); err != nil || len(r.SuiteErrors) != 1 {
		t.Errorf("failed BeforeSuite: %v %v, want one suite error", r.SuiteErrors, err)
	}
	if _, err := ParseJUnit(strings.NewReader("<testsuites><testsuite>")); err == nil {
		t.Error("a truncated report parsed")
	}
}

func TestSkipList(t *testing.T) {
	l, err := ParseSkipList(strings.NewReader(`# comment
[all]
public image with digest  # the upstream digest

[cube]
Container OOM  # memory limits are the VM's
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(l) != 2 || !l[0].All || l[1].All || l[1].Reason != "memory limits are the VM's" {
		t.Fatalf("entries %+v", l)
	}
	if got := l.Regexp(false); got != "(?:public image with digest)" {
		t.Errorf("runc's --ginkgo.skip %q", got)
	}
	if got := l.Regexp(true); got != "(?:public image with digest)|(?:Container OOM)" {
		t.Errorf("cube's --ginkgo.skip %q", got)
	}
	if _, ok := l.Match("[k8s.io] Container OOM runtime", false); ok {
		t.Error("a [cube] entry matched for runc")
	}
	if u := l.Unused([]string{"[k8s.io] Container OOM x"}); len(u) != 1 || u[0].Line != 3 {
		t.Errorf("unused %+v, want line 3", u)
	}
	for _, bad := range []string{"x # no section", "[cube]\nno reason", "[cube]\n( # bad regexp", "[all]\nx # "} {
		if _, err := ParseSkipList(strings.NewReader(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestCompare(t *testing.T) {
	run := func(st map[string]Status) *Run {
		r := &Run{Specs: map[string]Spec{}}
		for n, s := range st {
			r.Specs[n] = Spec{Name: n, Status: s, Message: "skipped - why"}
		}
		return r
	}
	runc := run(map[string]Status{"a": Passed, "b": Passed, "c": Failed, "d": Failed, "e": Passed, "f": Passed, "g": Passed})
	cube := run(map[string]Status{"a": Passed, "b": Failed, "c": Failed, "d": Passed, "e": Failed, "f": Skipped})
	skips, _ := ParseSkipList(strings.NewReader("[cube]\n^e$ # not yet\n"))
	c := Compare(runc, cube, skips, "")
	var reg []string
	for _, s := range c.Regressions {
		reg = append(reg, s.Name)
	}
	if strings.Join(reg, ",") != "b,f,g" {
		t.Errorf("regressions %v, want b (failed), f (skipped by critest for cube only), g (missing)", reg)
	}
	if strings.Join(c.BothFail, ",") != "c" || strings.Join(c.CubeOnlyPass, ",") != "d" {
		t.Errorf("both fail %v, cube only %v", c.BothFail, c.CubeOnlyPass)
	}
	tab := c.Table()
	for _, want := range []string{"runc           5       2", "REGRESSIONS", "  b\n"} {
		if !strings.Contains(tab, want) {
			t.Errorf("table lacks %q:\n%s", want, tab)
		}
	}
}
