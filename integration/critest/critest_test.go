package critest

import (
	"bufio"
	"context"
	_ "embed"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/critest/report"
	"github.com/cube-runtime/cube/integration/critest/testimages"
	"github.com/cube-runtime/cube/integration/cubetest"
)

// skipList is skip.txt (report.ParseSkipList): embedded, the test binary runs in the test host.
//
//go:embed skip.txt
var skipList string

// defaultFocus is the subset `make test` runs (--ginkgo.focus): runtime info, the image service against the
// local registry, the pod and container lifecycle, exec, DNS and hostname. Each cube pod is a microVM boot
// under nested TCG, so the subset is kept to about a dozen pods.
const defaultFocus = `Runtime info|Image Manager|PodSandbox runtime should support basic operations on PodSandbox|` +
	`Container runtime should support basic operations on container runtime should support (creating|starting|execSync) |` +
	`Streaming runtime should support streaming interfaces runtime should support exec with tty=false|` +
	`Networking runtime should support networking runtime should support (DNS config|set hostname|port mapping with host port and container port)`

// handler is one critest run: its name and --runtime-handler ("" is containerd's default, runc).
type handler struct{ name, flag string }

// TestCritest runs critest with runc and then with --runtime-handler cube, each against a fresh containerd
// 2.4.2 (CRI plugin, contrib/containerd/cube-runtime.toml, CNI bridge) whose registry names point at the
// test host's registry; prints the counts side by side and fails on a spec runc passes and cube does not,
// unless skip.txt lists it. Specs failing on both are shown, not counted against Cube (the test host lacks
// what they need: see the log).
func TestCritest(t *testing.T) {
	if _, err := os.Stat(cubetest.CritestBin); err != nil {
		t.Skipf("critest not in the test host: it was not found on this machine's PATH (.ci/install.d/containerd.sh builds cri-tools' critest v1.37.0 into /usr/local/bin): %v", err)
	}
	skips, err := report.ParseSkipList(strings.NewReader(skipList))
	if err != nil {
		t.Fatalf("skip.txt: %v", err)
	}
	hostsDir := startRegistry(t)
	focus := defaultFocus
	// Bounds of one critest run: in the test host the subset took about 1 (runc) and 3 (cube) minutes, the
	// whole suite about 8 (runc) and 34 (cube) (measured 2026-12, docs/kubernetes.md).
	limit := 25 * time.Minute
	if full() {
		focus, limit = "", 80*time.Minute
	}
	if f := os.Getenv("CUBE_CRITEST_FOCUS"); f != "" {
		focus = f
	}
	t.Logf("critest focus %q (CUBE_CRITEST_FULL=1 runs the whole suite, CUBE_CRITEST_FOCUS=REGEXP the specs it matches)", focus)

	runs := map[string]*report.Run{}
	start := time.Now()
	for _, h := range []handler{{"runc", ""}, {"cube", "cube"}} {
		t.Run(h.name, func(t *testing.T) {
			began := time.Now()
			runs[h.name] = runCritest(t, h, hostsDir, focus, skips.Regexp(h.name == "cube"), limit)
			t.Logf("critest with %s took %v (informational)", h.name, time.Since(began).Round(time.Second))
		})
	}
	runc, cube := runs["runc"], runs["cube"]
	if runc == nil || cube == nil {
		t.Fatal("a critest run gave no report (see its subtest)")
	}
	cmp := report.Compare(runc, cube, skips, focus)
	t.Logf("critest v1.37.0, runc vs cube (%v for both runs, informational):\n%s", time.Since(start).Round(time.Second), cmp.Table())
	t.Logf("spec durations, cube (informational):\n%s", cube.Durations())
	if rc := runc.Count(skips, false, focus); rc.Passed == 0 {
		t.Fatalf("no spec passed on runc: the setup (registry, CNI, containerd) is broken, not Cube")
	}
	if full() {
		names := make([]string, 0, len(runc.Specs))
		for n := range runc.Specs {
			names = append(names, n)
		}
		for _, e := range skips.Unused(names) {
			t.Errorf("skip.txt line %d %q matches no spec of critest v1.37.0: remove it", e.Line, e.Pattern)
		}
	}
	for _, s := range cmp.Regressions {
		t.Errorf("cube: %s\n  %s\n  (passes on runc; fix it, or list it in integration/critest/skip.txt with the reason)", s.Name, s.Message)
	}
}

// startRegistry runs cube-testregistry (critest's images, built from busybox, served on 127.0.0.1) and
// returns the hosts.toml directory pointing containerd's registry names at it; a cleanup stops it.
func startRegistry(t *testing.T) string {
	dir := t.TempDir()
	hostsDir := filepath.Join(dir, "hosts")
	cmd := exec.Command(RegistryBin, "-hosts-dir", hostsDir)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start cube-testregistry: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	ready := make(chan string, 1)
	var out strings.Builder
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if addr, ok := strings.CutPrefix(sc.Text(), "ready "); ok {
				ready <- addr
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	select {
	case addr := <-ready:
		t.Logf("cube-testregistry on %s:\n%s", addr, out.String())
	case <-time.After(2 * time.Minute):
		t.Fatalf("cube-testregistry not ready after 2 minutes:\n%s%s", out.String(), stderr.String())
	}
	return hostsDir
}

// criConfig is what the critest containerd adds to cubetest's CRI config: the registry hosts; for cube, the
// cube snapshotter as the image service's: critest's PullImage names no runtime handler, so the images it
// pulls unpack into the default snapshotter, and a cube pod's containers need them in cube's.
func criConfig(h handler, hostsDir string) string {
	c := fmt.Sprintf("\n[plugins.\"io.containerd.cri.v1.images\".registry]\n  config_path = %q\n", hostsDir)
	if h.name == "cube" {
		c += "\n[plugins.\"io.containerd.cri.v1.images\"]\n  snapshotter = \"cube\"\n"
	}
	return c
}

// runCritest starts containerd for h and runs critest against it; it returns the parsed JUnit report. The
// subtest fails only when critest gave no usable report: failed specs are the comparison's business.
func runCritest(t *testing.T, h handler, hostsDir, focus, skip string, limit time.Duration) *report.Run {
	// The sandbox image is the registry's pause (testimages.PauseImage), pulled at the first pod: its process
	// is named pause, which critest expects of pid 1 in a pod's shared pid namespace.
	c := cubetest.StartCRI(t, cubetest.CRIOptions{Config: criConfig(h, hostsDir), SandboxImage: testimages.PauseImage})
	junit := filepath.Join(c.Dir, "junit.xml")
	args := []string{"--runtime-endpoint", c.Endpoint(), "--image-endpoint", c.Endpoint(),
		"--config", filepath.Join(c.Dir, "no-crictl.yaml"),
		"--ginkgo.junit-report", junit, "--ginkgo.no-color", "--ginkgo.timeout", limit.String()}
	if h.flag != "" {
		args = append(args, "--runtime-handler", h.flag)
	}
	if focus != "" {
		args = append(args, "--ginkgo.focus", focus)
	}
	if skip != "" {
		args = append(args, "--ginkgo.skip", skip)
	}
	logPath := filepath.Join(c.Dir, "critest.log")
	// ginkgo's own timeout ends the suite with a report; the process deadline is the backstop.
	rc, err := runLogged(t, h.name, cubetest.CritestBin, args, c.Env, logPath, limit+5*time.Minute)
	if err != nil {
		t.Fatalf("critest with %s: %v", h.name, err)
	}
	f, err := os.Open(junit)
	if err != nil {
		t.Fatalf("critest with %s exited %d without a JUnit report: %v\n%s", h.name, rc, err, tail(logPath, 60))
	}
	defer f.Close()
	run, err := report.ParseJUnit(f)
	if err != nil {
		t.Fatalf("critest with %s: %v", h.name, err)
	}
	if len(run.SuiteErrors) > 0 {
		t.Fatalf("critest with %s: suite setup failed: %s\n%s", h.name, strings.Join(run.SuiteErrors, "\n"), tail(logPath, 60))
	}
	cnt := run.Count(nil, h.name == "cube", "")
	t.Logf("critest with %s: exit %d, %d passed, %d failed", h.name, rc, cnt.Passed, cnt.Failed)
	for _, s := range run.Specs {
		if s.Status == report.Failed {
			t.Logf("%s FAILED: %s\n    %s", h.name, s.Name, strings.ReplaceAll(s.Message, "\n", "\n    "))
		}
	}
	return run
}

// runLogged runs critest with its whole output in logPath and its progress (each spec's outcome line and
// the one naming the spec) on stdout; a non-zero exit (failed specs) is rc, not an error.
func runLogged(t *testing.T, name, bin string, args, env []string, logPath string, limit time.Duration) (int, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	cmd.WaitDelay = 10 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = io.MultiWriter(logf, pw), io.MultiWriter(logf, pw)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		progress(pr, "critest "+name+": ")
	}()
	t.Logf("critest %s", strings.Join(args, " "))
	err = cmd.Run()
	pw.Close()
	wg.Wait()
	if ee, ok := err.(*exec.ExitError); ok && ctx.Err() == nil {
		return ee.ExitCode(), nil
	}
	if err != nil {
		return -1, fmt.Errorf("run critest: %w\n%s", err, tail(logPath, 60))
	}
	return 0, nil
}

// progress copies ginkgo's verbose output's spec outcome lines ("• [12.3 seconds]", "• [FAILED] …",
// "S [SKIPPED]") and the line after each (the spec's text) to stdout, prefixed.
func progress(r io.Reader, prefix string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	next := false
	for sc.Scan() {
		l := sc.Text()
		switch {
		case next:
			fmt.Printf("%s  %s\n", prefix, strings.TrimSpace(l))
			next = false
		case strings.HasPrefix(l, "•") || strings.HasPrefix(l, "S [SKIPPED]") || strings.HasPrefix(l, "Ran "):
			fmt.Printf("%s%s\n", prefix, l)
			next = !strings.HasPrefix(l, "Ran ")
		}
	}
	io.Copy(io.Discard, r)
}

// tail is the last n lines of the file at p.
func tail(p string, n int) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return err.Error()
	}
	return cubetest.LastLines(string(b), n)
}
