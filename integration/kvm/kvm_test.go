// Package kvm is the first end-to-end test: the synthetic smoke guest of hypervisor/kvmtest, run inside the
// test host on its nested /dev/kvm (real KVM with SVM and nested paging), where a missing /dev/kvm is a
// failure, not a skip.
package kvm

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/hypervisor/kvm"
	"github.com/cube-runtime/cube/hypervisor/kvmtest"
	"github.com/cube-runtime/cube/integration/testhost"
)

func TestMain(m *testing.M) {
	flag.Parse()
	// tun: cube-vmm's virtio-net tests open a real TAP device.
	o := testhost.Options{Timeout: 20 * time.Minute, Modules: []string{"tun"}}
	if testhost.Inside() || testing.Short() {
		testhost.Main(m, o)
	}
	dir, err := os.MkdirTemp("", "cube-kvm-tier-")
	if err == nil {
		o.Files, err = buildKVMTier(dir)
	}
	if err == nil {
		o.Env, err = tierEnv()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: build the KVM tier's test binaries: %v\n", err)
		os.Exit(1)
	}
	code := testhost.RunMain(m, o)
	os.RemoveAll(dir) // not deferred: os.Exit skips deferred calls
	os.Exit(code)
}

func TestInsideTestHost(t *testing.T) {
	if !testhost.Inside() {
		t.Fatal("e2e test ran outside the test host")
	}
	cpuinfo, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, flag := range []string{" svm", " npt"} {
		if !strings.Contains(string(cpuinfo), flag) {
			t.Errorf("test host CPU lacks%s", flag)
		}
	}
	t.Logf("test host kernel: %s", strings.TrimSpace(readFile(t, "/proc/sys/kernel/osrelease")))
}

func TestSmokeGuestOnNestedKVM(t *testing.T) {
	res, err := kvmtest.Smoke(kvm.DefaultDevice)
	if err != nil {
		t.Fatalf("smoke guest on the test host's %s: %v", kvm.DefaultDevice, err)
	}
	if len(res.Exits) != 2 || res.Exits[0] != kvm.ExitIO || res.Exits[1] != kvm.ExitHLT {
		t.Errorf("exits = %v, want [IO HLT]", res.Exits)
	}
	if res.Port != kvmtest.SmokePort || res.OutByte != kvmtest.SmokeByte {
		t.Errorf("I/O exit: port %#x byte %#x, want port %#x byte %#x", res.Port, res.OutByte, kvmtest.SmokePort, kvmtest.SmokeByte)
	}
	if res.MemoryWord != kvmtest.SmokeValue {
		t.Errorf("guest memory word = %#x, want %#x", res.MemoryWord, kvmtest.SmokeValue)
	}
	t.Logf("nested KVM: API %d, exits %v, out %#x to port %#x, memory[%#x] = %#x, %d MSRs in the index list",
		res.APIVersion, res.Exits, res.OutByte, res.Port, kvmtest.SmokeAddr, res.MemoryWord, res.MSRListSize)
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
