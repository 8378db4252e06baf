package kvm

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/testhost"
)

// The KVM tier: the hypervisor packages' tests with tiny synthetic guests need a /dev/kvm that runs guest
// code at CPL0, which the machines we build on do not have (none, or PVM). Their test binaries are built on
// the host and copied into the test host with the packages' source directories (their testdata) under
// tierDir/src, and run there on real nested KVM, where a test that skips for want of KVM is a failure. The
// golden snapshots are found through runtime.Caller, i.e. at the repository's absolute path on the host:
// inside, that path is made a symlink to tierDir/src (it cannot be copied there: a host path under /tmp would
// be hidden by the test host's own /tmp).

// kvmTierPkgs are the packages whose tests drive /dev/kvm, relative to the repository root.
var kvmTierPkgs = []string{"hypervisor/kvmtest", "hypervisor/vcpu", "hypervisor/machine", "hypervisor/vmmcmd"}

// tierData are directories the tests read outside their own package.
var tierData = []string{"hypervisor/snapshot/testdata"}

// tierDir is where the binaries are inside the test host; the sources are under tierDir/src.
const tierDir = "/cube/kvmtier"

var tierSrc = filepath.Join(tierDir, "src")

func tierBinary(pkg string) string {
	return filepath.Join(tierDir, strings.ReplaceAll(pkg, "/", "_")+".test")
}

// envRoot carries the repository's absolute path into the test host, where the payload's working directory
// is not the package's.
const envRoot = "CUBE_KVM_TIER_ROOT"

// repoRoot is the repository's absolute path: the same on both sides.
func repoRoot() (string, error) {
	if r := os.Getenv(envRoot); r != "" {
		return r, nil
	}
	return filepath.Abs("../..")
}

// buildKVMTier builds the packages' test binaries into dir and returns the test host's Files for them.
func buildKVMTier(dir string) (map[string]string, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	files := map[string]string{}
	for _, pkg := range kvmTierPkgs {
		bin := filepath.Join(dir, filepath.Base(tierBinary(pkg)))
		cmd := exec.Command("go", "test", "-c", "-o", bin, "./"+pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go test -c ./%s: %v\n%s", pkg, err, out)
		}
		files[tierBinary(pkg)] = bin
		files[filepath.Join(tierSrc, pkg)] = filepath.Join(root, pkg)
	}
	for _, d := range tierData {
		files[filepath.Join(tierSrc, d)] = filepath.Join(root, d)
	}
	return files, nil
}

// tierEnv is the payload's environment for TestHypervisorKVMTier.
func tierEnv() ([]string, error) {
	root, err := repoRoot()
	return []string{envRoot + "=" + root}, err
}

// kvmSkip matches the reason of a test skipped because the KVM device is missing (hypervisor tests say
// "no KVM device", "no KVM on this machine" or "no /dev/kvm").
var kvmSkip = regexp.MustCompile(`_test\.go:[0-9]+: (no KVM (device|on this machine)|no /dev/kvm)`)

func TestHypervisorKVMTier(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// The host's repository path points at the copied sources (runtime.Caller paths resolve).
	if err := os.MkdirAll(filepath.Dir(root), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(tierSrc, root); err != nil {
		t.Fatalf("link the repository's host path %s to the copied sources: %v", root, err)
	}
	for _, pkg := range kvmTierPkgs {
		t.Run(strings.ReplaceAll(pkg, "/", "_"), func(t *testing.T) {
			cmd := exec.Command(tierBinary(pkg), "-test.v", "-test.count=1", "-test.timeout=8m")
			cmd.Dir = filepath.Join(tierSrc, pkg)
			t0 := time.Now()
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v after %v\n%s", pkg, err, time.Since(t0).Round(time.Millisecond), testhost.TailLines(out, 400))
			}
			passed := 0
			for _, l := range bytes.Split(out, []byte("\n")) {
				if bytes.HasPrefix(bytes.TrimSpace(l), []byte("--- PASS")) {
					passed++
				}
			}
			if skips := skippedForKVM(out); len(skips) > 0 {
				t.Errorf("%s: tests skipped for want of KVM inside the test host, where /dev/kvm is real: %q", pkg, skips)
			}
			if passed == 0 {
				t.Fatalf("%s: no test passed\n%s", pkg, testhost.TailLines(out, 40))
			}
			t.Logf("%s: %d tests passed on the test host's nested KVM in %v", pkg, passed, time.Since(t0).Round(time.Millisecond))
		})
	}
}

// skippedForKVM returns the output lines of tests that skipped for want of KVM (their t.Skipf reasons).
func skippedForKVM(out []byte) []string {
	var skips []string
	for _, l := range strings.Split(string(out), "\n") {
		if kvmSkip.MatchString(l) {
			skips = append(skips, strings.TrimSpace(l))
		}
	}
	return skips
}
