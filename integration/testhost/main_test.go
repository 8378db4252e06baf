package testhost

import (
	"reflect"
	"regexp"
	"testing"
)

func TestFailedTests(t *testing.T) {
	out := []byte("=== RUN   TestA\n--- PASS: TestA (0.01s)\n" +
		"=== RUN   TestB\n    --- FAIL: TestB/kill (85.05s)\n--- FAIL: TestB (170.95s)\n" +
		"--- FAIL: TestC (1.00s)\n    x_test.go:1: --- FAIL: TestD not at line start\n--- FAIL: TestB (1s)\nFAIL\n")
	if got, want := failedTests(out), []string{"TestB", "TestC"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("failedTests = %v, want %v", got, want)
	}
	if got := failedTests([]byte("panic: boom\nFAIL\n")); len(got) != 0 {
		t.Fatalf("failedTests of a panic = %v, want none (the whole package is rerun only after a kernel failure)", got)
	}
}

func TestWithRun(t *testing.T) {
	for _, c := range []struct{ in, want []string }{
		{[]string{"-test.v=true", "-test.run", "TestX", "-test.timeout=30m0s"}, []string{"-test.v=true", "-test.timeout=30m0s", "-test.run=^(TestB|TestC)$"}},
		{[]string{"-test.run=Ctr", "-test.v=true"}, []string{"-test.v=true", "-test.run=^(TestB|TestC)$"}},
		{nil, []string{"-test.run=^(TestB|TestC)$"}},
	} {
		got := withRun(c.in, []string{"TestB", "TestC"})
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("withRun(%v) = %v, want %v", c.in, got, c.want)
		}
		re := regexp.MustCompile(got[len(got)-1][len("-test.run="):])
		if !re.MatchString("TestB") || re.MatchString("TestBx") || re.MatchString("TestA") {
			t.Errorf("pattern %s selects the wrong tests", re)
		}
	}
}
