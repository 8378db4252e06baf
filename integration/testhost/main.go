package testhost

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Main is for a test package's TestMain. Inside a test host it runs the tests. Outside, it boots one test host
// for the whole package with this test binary as the payload (same test flags), streams the tests' output and
// exits with their status; the test host's console tail is printed when anything fails.
func Main(m *testing.M, o Options) { os.Exit(RunMain(m, o)) }

// RunMain is Main without the exit: it returns the status, so a TestMain can clean up what it prepared.
func RunMain(m *testing.M, o Options) int {
	if Inside() {
		return m.Run()
	}
	flag.Parse()
	if testing.Short() {
		fmt.Println("SKIP: end-to-end tests run in the QEMU test host, which -short leaves out (run `make e2e`)")
		return 0
	}
	return runSelf(o)
}

// Reruns: the test host is TCG with an emulated AMD-V CPU, whose nested guests sometimes stall, triple-fault
// or take the test host's own kernel down (README "Known problems"). A package is therefore run at most
// maxAttempts times: after a kernel failure the whole package again, after failed tests only those top-level
// tests again. Each rerun says so loudly; a test that fails in every attempt fails the package.
const (
	maxAttempts = 5
	// rerunBudget: no rerun starts after this much wall time, so a package stays inside go test's -timeout
	// (the e2e tier runs with 60m; a shim package attempt takes 4–7 minutes).
	rerunBudget = 25 * time.Minute
)

func runSelf(o Options) int {
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "cube-testhost: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	begin := time.Now()
	args := payloadArgs(os.Args[1:])
	var flaky []string   // what failed in an earlier attempt and was run again
	var skipped []string // tests that passed before a kernel failure, not run again
	attempts := maxAttempts
	// CUBE_TESTHOST_ATTEMPTS=1 turns reruns off (developing a test: one failure is enough).
	if n, err := strconv.Atoi(os.Getenv("CUBE_TESTHOST_ATTEMPTS")); err == nil && n >= 1 && n <= maxAttempts {
		attempts = n
	}
	for attempt := 1; ; attempt++ {
		res, err := Run(ctx, o, Payload{Binary: exe, Args: args}, os.Stdout)
		last := attempt >= attempts || ctx.Err() != nil || time.Since(begin) > rerunBudget
		var re *RunError
		switch {
		case errors.As(err, &re) && re.KernelFailure && !last:
			if r := KernelReport(re.Result.Console, 80); r != "" {
				fmt.Fprintf(os.Stderr, "--- test host kernel report (first 80 lines) ---\n%s\n", r)
			}
			fmt.Fprintf(os.Stderr, "cube-testhost: %s\n--- test host console (tail) ---\n%s\n"+
				"cube-testhost: RERUN: the test host's kernel failed, not a test: running the same tests again in a fresh test host (attempt %d of %d)\n",
				re.Reason, re.Result.ConsoleTail(40), attempt+1, maxAttempts)
			flaky = append(flaky, fmt.Sprintf("attempt %d: test host kernel failure", attempt))
			// What passed before the failure need not run again: less nested work, less exposure.
			if passed := passedTests(re.Result.Output); len(passed) > 0 {
				skipped = append(passed, skipped...)
				args = withSkip(args, skipped)
				fmt.Fprintf(os.Stderr, "cube-testhost: passed before the failure, not run again: %s\n", strings.Join(passed, ", "))
			}
			continue
		case err != nil:
			if errors.Is(err, ErrNoQEMU) {
				fmt.Fprintf(os.Stderr, "FAIL: end-to-end tests need the test host: %v\n", err)
			} else {
				fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
			}
			return 1
		}
		fmt.Printf("cube-testhost: boot to payload %.2fs, wall %.2fs, payload exit %d (artifacts %s)\n",
			res.Boot.Seconds(), res.Wall.Seconds(), res.ExitCode, res.CacheKey)
		if res.ExitCode == 0 {
			if len(flaky) > 0 {
				fmt.Printf("cube-testhost: FLAKY: passed in attempt %d after: %s\n", attempt, strings.Join(flaky, "; "))
			}
			return 0
		}
		fmt.Fprintf(os.Stderr, "--- test host console (tail) ---\n%s\n", res.ConsoleTail(40))
		if d := failureDigest(res.Output, 12); d != "" {
			fmt.Fprintf(os.Stderr, "--- failed tests (attempt %d) ---\n%s", attempt, d)
		}
		failed := failedTests(res.Output)
		if last || len(failed) == 0 || !allTests(failed) {
			return res.ExitCode
		}
		fmt.Fprintf(os.Stderr, "cube-testhost: RERUN: %s failed; running only them again in a fresh test host (attempt %d of %d)\n",
			strings.Join(failed, ", "), attempt+1, maxAttempts)
		flaky = append(flaky, fmt.Sprintf("attempt %d: %s failed", attempt, strings.Join(failed, ", ")))
		args = withRun(args, failed)
	}
}

// failedTests returns the top-level tests that go test's verbose output reports as failed, in order.
func failedTests(out []byte) []string { return topLevel(out, "--- FAIL: ") }

// passedTests returns the top-level tests that go test's verbose output reports as passed.
func passedTests(out []byte) []string { return topLevel(out, "--- PASS: ") }

// topLevel returns the top-level tests (no subtests) on result lines starting with prefix, in order, once each.
func topLevel(out []byte, prefix string) []string {
	var names []string
	seen := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		rest, ok := strings.CutPrefix(line, prefix)
		if !ok {
			continue
		}
		name, _, _ := strings.Cut(rest, " ")
		if name == "" || strings.Contains(name, "/") || seen[name] {
			continue
		}
		seen[name] = true
		names = append(names, name)
	}
	return names
}

// withSkip adds -test.skip for exactly the named top-level tests, replacing an earlier one of ours (the
// caller passes every test to skip so far); a caller's own -test.skip is left alone (and nothing is added).
func withSkip(args, tests []string) []string {
	rest, pattern := dropFlag(args, "skip")
	if pattern != "" && !strings.HasPrefix(pattern, "^(") {
		return args
	}
	return append(rest, "-test.skip="+exactly(tests))
}

// withRun replaces any -test.run in args with one selecting exactly the named top-level tests.
func withRun(args, tests []string) []string {
	rest, _ := dropFlag(args, "run")
	return append(rest, "-test.run="+exactly(tests))
}

// dropFlag removes the test flag name (-test.name=v, -test.name v, -name…) from args and returns its value.
func dropFlag(args []string, name string) (rest []string, value string) {
	for i := 0; i < len(args); i++ {
		n, v, hasValue := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if n != "test."+name && n != name {
			rest = append(rest, args[i])
			continue
		}
		if !hasValue && i+1 < len(args) {
			i++ // the value is the next argument
			v = args[i]
		}
		value = v
	}
	return rest, value
}

// exactly is a -test.run/-test.skip pattern matching exactly the named top-level tests.
func exactly(tests []string) string {
	quoted := make([]string, len(tests))
	for i, t := range tests {
		quoted[i] = regexp.QuoteMeta(t)
	}
	return "^(" + strings.Join(quoted, "|") + ")$"
}

// allTests says whether every name is a Test function: -test.run cannot select benchmarks, examples or
// fuzz targets again, so a run where one of those failed is not rerun.
func allTests(names []string) bool {
	for _, n := range names {
		if !strings.HasPrefix(n, "Test") {
			return false
		}
	}
	return true
}

// payloadArgs keeps the test flags that make sense inside (run, v, count, timeout, bench…) and drops those
// naming host files, which do not exist in the test host.
func payloadArgs(args []string) []string {
	var out []string
	for _, a := range args {
		name := strings.TrimLeft(a, "-")
		name, _, _ = strings.Cut(name, "=")
		switch name {
		case "test.testlogfile", "test.coverprofile", "test.outputdir", "test.cpuprofile", "test.memprofile",
			"test.blockprofile", "test.mutexprofile", "test.trace", "test.gocoverdir":
			continue
		}
		out = append(out, a)
	}
	return out
}

// failureDigest returns, for each failed test that has no failed subtest, the last lines it logged (go test -v
// output): at the end of a long run they put the failure messages where a reader of the log's tail sees them,
// instead of far above behind later tests' output and diagnostics dumps.
func failureDigest(out []byte, perTest int) string {
	type block struct{ lines []string }
	blocks := map[string]*block{}
	cur := ""
	var failed []string
	for _, line := range strings.Split(string(out), "\n") {
		trimmed := strings.TrimLeft(line, " ")
		if rest, ok := strings.CutPrefix(trimmed, "--- FAIL: "); ok {
			name, _, _ := strings.Cut(rest, " ")
			failed = append(failed, name)
			cur = "" // what follows a result line belongs to the next "=== " header, or to no test
			continue
		}
		if strings.HasPrefix(trimmed, "--- ") {
			cur = ""
			continue
		}
		if h, ok := strings.CutPrefix(line, "=== "); ok {
			// "=== RUN   TestX/sub", "=== NAME  TestX", "=== CONT  TestX", "=== PAUSE TestX"
			if f := strings.Fields(h); len(f) == 2 {
				cur = f[1]
			}
			continue
		}
		if cur == "" || line == "" {
			continue
		}
		b := blocks[cur]
		if b == nil {
			b = &block{}
			blocks[cur] = b
		}
		b.lines = append(b.lines, line)
		if len(b.lines) > perTest {
			b.lines = b.lines[1:]
		}
	}
	var sb strings.Builder
	for _, name := range failed {
		leaf := true
		for _, other := range failed {
			if strings.HasPrefix(other, name+"/") {
				leaf = false
			}
		}
		b := blocks[name]
		if !leaf || b == nil {
			continue
		}
		fmt.Fprintf(&sb, "--- %s: last %d lines it logged:\n%s\n", name, len(b.lines), strings.Join(b.lines, "\n"))
	}
	return sb.String()
}
