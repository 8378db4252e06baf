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

func TestFailureDigest(t *testing.T) {
	out := []byte(`=== RUN   TestA
=== RUN   TestA/kill
    x_test.go:10: started
    x_test.go:11: ctr task kill: rc 1
=== RUN   TestA/ok
    x_test.go:20: fine
=== NAME  TestA
    x_test.go:30: containerd log (tail):
        lots of lines
--- FAIL: TestA (2.00s)
    --- FAIL: TestA/kill (1.00s)
    --- PASS: TestA/ok (1.00s)
=== RUN   TestB
    y_test.go:1: one
    y_test.go:2: two
    y_test.go:3: boom
--- FAIL: TestB (1.00s)
FAIL
`)
	got := failureDigest(out, 2)
	want := "--- TestA/kill: last 2 lines it logged:\n    x_test.go:10: started\n    x_test.go:11: ctr task kill: rc 1\n" +
		"--- TestB: last 2 lines it logged:\n    y_test.go:2: two\n    y_test.go:3: boom\n"
	if got != want {
		t.Fatalf("failureDigest:\n%s\nwant:\n%s", got, want)
	}
}

func TestAllTests(t *testing.T) {
	if !allTests([]string{"TestA", "TestB"}) || allTests([]string{"TestA", "BenchmarkX"}) || allTests([]string{"ExampleY"}) {
		t.Fatal("allTests must accept only Test functions")
	}
}

func TestPassedTestsAndWithSkip(t *testing.T) {
	out := []byte("--- PASS: TestA (1s)\n    --- PASS: TestB/sub (1s)\n--- FAIL: TestC (1s)\n--- PASS: TestD (2s)\n")
	passed := passedTests(out)
	if want := []string{"TestA", "TestD"}; !reflect.DeepEqual(passed, want) {
		t.Fatalf("passedTests = %v, want %v", passed, want)
	}
	args := withSkip([]string{"-test.v=true"}, passed)
	if want := []string{"-test.v=true", "-test.skip=^(TestA|TestD)$"}; !reflect.DeepEqual(args, want) {
		t.Fatalf("withSkip = %v, want %v", args, want)
	}
	// After a second failure runSelf passes every test skipped so far: ours is replaced.
	args = withSkip(args, []string{"TestE", "TestA", "TestD"})
	if want := []string{"-test.v=true", "-test.skip=^(TestE|TestA|TestD)$"}; !reflect.DeepEqual(args, want) {
		t.Fatalf("withSkip again = %v, want %v", args, want)
	}
	re := regexp.MustCompile(args[1][len("-test.skip="):])
	if !re.MatchString("TestA") || re.MatchString("TestAB") || re.MatchString("TestC") {
		t.Fatalf("skip pattern %s is wrong", re)
	}
	// The caller's own -test.skip is not touched.
	if got := withSkip([]string{"-test.skip=Slow"}, passed); !reflect.DeepEqual(got, []string{"-test.skip=Slow"}) {
		t.Fatalf("withSkip with the caller's skip = %v", got)
	}
}
