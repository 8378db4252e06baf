// Package stress measures the test host's stability: it runs many nested VM lifecycles (boot the guest image,
// a busy container through the agent, snapshot, rollback, SIGKILL of cube-vmm in KVM_RUN) in test hosts, one
// after another, and counts what failed: the test host's kernel (oops, panic, soft lockup, RCU stall), nested
// guests that triple-fault or stall, and the nested boot time. A test host whose kernel dies is replaced and
// the count goes on. Opt-in, not part of `make test`:
//
//	CUBE_STRESS_LIFECYCLES=50 make stress
//	CUBE_STRESS_LIFECYCLES=50 CUBE_TESTHOST_KVM_AMD=stock CUBE_TESTHOST_CPU=EPYC-Rome,+svm,+npt make stress
//	CUBE_STRESS_HOST_LOAD=1 ...   (forks, TLB shootdowns and disk interrupts in the test host meanwhile)
//	CUBE_STRESS_WORKLOAD=busy ... (the guest's container: forks (default) or busy)
//	CUBE_STRESS_VCPUS=1 ...       (the nested guest's vCPUs: 2 (default) or 1)
//
// The platform under test comes from the CUBE_TESTHOST_* variables (testhost.Platform). It ends with one
// line of figures ("stress: ..."); every test host's output and console, and each kernel report, are kept in
// CUBE_STRESS_LOG (default a new /tmp/cube-stress-* directory).
package stress

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/sandboxenv"
	"github.com/cube-runtime/cube/integration/testhost"
)

// Environment: the host side reads envLifecycles and envLog; it sets envCount and envFirst for the payload.
const (
	envLifecycles = "CUBE_STRESS_LIFECYCLES"
	envLog        = "CUBE_STRESS_LOG"
	envCount      = "CUBE_STRESS_COUNT"
	envFirst      = "CUBE_STRESS_FIRST"
)

func TestMain(m *testing.M) {
	if testhost.Inside() {
		os.Exit(m.Run())
	}
	flag.Parse()
	v := os.Getenv(envLifecycles)
	if v == "" {
		// The unit tests of the counting still run; the measurement itself is opt-in.
		fmt.Printf("stress: measurement not run: it is opt-in; set %s=N (e.g. %s=50 make stress)\n", envLifecycles, envLifecycles)
		os.Exit(m.Run())
	}
	total, err := strconv.Atoi(v)
	if err != nil || total < 1 {
		fmt.Fprintf(os.Stderr, "FAIL: %s=%q: want a number of lifecycles ≥ 1\n", envLifecycles, v)
		os.Exit(2)
	}
	env, err := sandboxenv.Prepare("cube-stress-", nil)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: prepare guest artifacts: %v\n", err)
		os.Exit(1)
	}
	code := drive(env, total)
	env.Close()
	os.Exit(code)
}

// tally is what the measurement counted.
type tally struct {
	lifecycles  int
	results     map[string]int
	kernel      map[string]int // test-host kernel failures by kind
	kernelTotal int
	warnings    int // WARNING: lines in surviving test hosts (not failures, but reported)
	hosts       int
	boots       []int64
	wall        time.Duration
}

func drive(env *sandboxenv.Env, total int) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	logDir := os.Getenv(envLog)
	if logDir == "" {
		if logDir, err = os.MkdirTemp("", "cube-stress-"); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL:", err)
			return 1
		}
	} else if err := os.MkdirAll(logDir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	resolved := (testhost.Options{}).Resolved()
	platform := resolved.Platform
	workload, err := workloadName()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 2
	}
	vcpus, err := guestVCPUs()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 2
	}
	hostLoad := "no host load"
	if os.Getenv(envLoad) == "1" {
		hostLoad = "host load"
	}
	load := fmt.Sprintf("smp %d, workload %s, %s guest vCPUs, %s", resolved.CPUs, workload, vcpus, hostLoad)
	fmt.Printf("stress: %d lifecycles on %s, %s; logs go to %s\n", total, platform, load, logDir)
	t := &tally{results: map[string]int{}, kernel: map[string]int{}}
	begin := time.Now()
	done := 0
	for done < total && ctx.Err() == nil {
		t.hosts++
		left := total - done
		o := testhost.Options{
			Files:   env.Files,
			Timeout: 5*time.Minute + time.Duration(left)*time.Minute,
			Env: []string{envCount + "=" + strconv.Itoa(left), envFirst + "=" + strconv.Itoa(done+1),
				envLoad + "=" + os.Getenv(envLoad), envWorkload + "=" + workload, envVCPUs + "=" + vcpus},
		}
		res, err := testhost.Run(ctx, o, testhost.Payload{Binary: exe, Args: []string{"-test.run=^TestLifecycles$", "-test.v"}}, progress{})
		var re *testhost.RunError
		if err != nil && !errors.As(err, &re) {
			fmt.Fprintf(os.Stderr, "FAIL: test host %d: %v\n", t.hosts, err)
			return 1
		}
		if re != nil {
			res = re.Result
		}
		// Everything a test host printed stays for reading later, whatever happened.
		os.WriteFile(filepath.Join(logDir, fmt.Sprintf("host-%02d.output", t.hosts)), res.Output, 0o644)
		os.WriteFile(filepath.Join(logDir, fmt.Sprintf("host-%02d.console", t.hosts)), res.Console, 0o644)
		lines := parseLines(res.Output)
		for _, l := range lines {
			t.results[l.Result]++
			if l.BootMS > 0 {
				t.boots = append(t.boots, l.BootMS)
			}
		}
		done += len(lines)
		kind, report := kernelFailure(res.Console)
		switch {
		case kind != "":
			t.kernelTotal++
			t.kernel[kind]++
			f := filepath.Join(logDir, fmt.Sprintf("host-%02d-%s.report", t.hosts, kind))
			os.WriteFile(f, []byte(report), 0o644)
			fmt.Printf("stress: test host %d: kernel failure (%s) after %d lifecycles here: %s (console in %s)\n",
				t.hosts, kind, len(lines), firstLine(report), f)
			if re != nil && done < total {
				// The lifecycle that was running when the kernel died.
				t.results[resultKernel]++
				done++
			}
		case re != nil:
			f := filepath.Join(logDir, fmt.Sprintf("host-%02d.console", t.hosts))
			fmt.Printf("stress: test host %d: %s (console in %s)\n", t.hosts, re.Reason, f)
			t.results["host-hang"]++
			done++
		case len(lines) == 0:
			fmt.Fprintf(os.Stderr, "FAIL: test host %d ran no lifecycle (payload exit %d):\n%s\n", t.hosts, res.ExitCode, testhost.TailLines(res.Output, 40))
			return 1
		}
		t.warnings += bytes.Count(res.Console, []byte("] WARNING: CPU: "))
	}
	t.lifecycles = done // fewer than asked when interrupted
	t.wall = time.Since(begin)
	fmt.Println(t.summary(platform, load))
	return 0
}

// progress forwards only the STRESS lines and failures of the payload, so the log stays readable.
type progress struct{}

func (progress) Write(p []byte) (int, error) {
	for _, l := range strings.SplitAfter(string(p), "\n") {
		if strings.HasPrefix(l, linePrefix) || strings.Contains(l, "--- FAIL") {
			os.Stdout.WriteString(l)
		}
	}
	return len(p), nil
}

func parseLines(out []byte) []stressLine {
	var ls []stressLine
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		s, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), linePrefix)
		if !ok {
			continue
		}
		var l stressLine
		if json.Unmarshal([]byte(s), &l) == nil && l.Result != "" {
			ls = append(ls, l)
		}
	}
	return ls
}

// kernelKinds classify a test-host kernel report by its first fatal line, most specific first.
var kernelKinds = []struct {
	kind string
	re   *regexp.Regexp
}{
	{"stack-guard", regexp.MustCompile(`stack guard page was hit|kernel stack overflow|corrupted stack end`)},
	{"soft-lockup", regexp.MustCompile(`watchdog: BUG: soft lockup`)},
	{"rcu-stall", regexp.MustCompile(`rcu: INFO: rcu_\w+ (self-detected stall|detected stalls)`)},
	{"double-fault", regexp.MustCompile(`double fault`)},
	{"oops", regexp.MustCompile(`\] (BUG: |Oops: |general protection fault)`)},
	{"panic", regexp.MustCompile(`Kernel panic - not syncing`)},
}

// kernelFailure names the kind of the first kernel failure on a console ("" if none) and the report: the
// earliest line any kind matches, classified by the most specific kind that matches that line.
func kernelFailure(console []byte) (string, string) {
	first := -1
	for _, k := range kernelKinds {
		if loc := k.re.FindIndex(console); loc != nil && (first < 0 || loc[0] < first) {
			first = loc[0]
		}
	}
	if first < 0 {
		return "", ""
	}
	start := bytes.LastIndexByte(console[:first], '\n') + 1
	line, _, _ := bytes.Cut(console[start:], []byte("\n"))
	for _, k := range kernelKinds {
		if k.re.Match(line) {
			return k.kind, testhost.KernelReport(console, 80)
		}
	}
	return "unknown", testhost.KernelReport(console, 80)
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return l
}

// summary is the one line of figures the measurement ends with.
func (t *tally) summary(p testhost.Platform, load string) string {
	var kinds, res []string
	for k, n := range t.kernel {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
	}
	for k, n := range t.results {
		if k != resultOK {
			res = append(res, fmt.Sprintf("%s %d", k, n))
		}
	}
	sort.Strings(kinds)
	sort.Strings(res)
	sort.Slice(t.boots, func(i, j int) bool { return t.boots[i] < t.boots[j] })
	pct := func(q float64) int64 {
		if len(t.boots) == 0 {
			return 0
		}
		return t.boots[int(q*float64(len(t.boots)-1))]
	}
	return fmt.Sprintf("stress: %s, %s | lifecycles %d, ok %d | test-host kernel failures %d [%s] | failed lifecycles [%s] | "+
		"WARNINGs %d | nested boot ms median %d p90 %d max %d | test hosts %d | wall %s",
		p, load, t.lifecycles, t.results[resultOK], t.kernelTotal, strings.Join(kinds, ", "), strings.Join(res, ", "),
		t.warnings, pct(0.5), pct(0.9), pct(1), t.hosts, t.wall.Round(time.Second))
}
