package testhost

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
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

func runSelf(o Options) int {
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "cube-testhost: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := Run(ctx, o, Payload{Binary: exe, Args: payloadArgs(os.Args[1:])}, os.Stdout)
	// The emulated machine's own kernel failing is not a test result (TCG's nested AMD-V, README "Known
	// problems"): run the package once more in a fresh test host, and say so. A second failure fails.
	var re *RunError
	if errors.As(err, &re) && re.KernelFailure && ctx.Err() == nil {
		fmt.Fprintf(os.Stderr, "cube-testhost: %s\n--- test host console (tail) ---\n%s\n"+
			"cube-testhost: the test host's kernel failed, not a test: running the package again in a fresh test host (attempt 2 of 2)\n",
			re.Reason, re.Result.ConsoleTail(40))
		res, err = Run(ctx, o, Payload{Binary: exe, Args: payloadArgs(os.Args[1:])}, os.Stdout)
	}
	if err != nil {
		if errors.Is(err, ErrNoQEMU) {
			fmt.Fprintf(os.Stderr, "FAIL: end-to-end tests need the test host: %v\n", err)
		} else {
			fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		}
		return 1
	}
	fmt.Printf("cube-testhost: boot to payload %.2fs, wall %.2fs, payload exit %d (artifacts %s)\n",
		res.Boot.Seconds(), res.Wall.Seconds(), res.ExitCode, res.CacheKey)
	if res.ExitCode != 0 {
		fmt.Fprintf(os.Stderr, "--- test host console (tail) ---\n%s\n", res.ConsoleTail(40))
	}
	return res.ExitCode
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
