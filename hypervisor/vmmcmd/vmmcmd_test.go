package vmmcmd

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/hypervisor/control"
	"github.com/cube-runtime/cube/hypervisor/kvmtest"
	"github.com/cube-runtime/cube/hypervisor/machine"
)

func needKVM(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/dev/kvm"); errors.Is(err, os.ErrNotExist) {
		t.Skip("no /dev/kvm on this machine")
	}
}

func kernel(t *testing.T, code []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(p, kvmtest.SyntheticBzImage(code), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func run(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	rc := Run(args, strings.NewReader(""), &out, &errb)
	return rc, out.String(), errb.String()
}

func TestExitStatuses(t *testing.T) {
	needKVM(t)
	cases := []struct {
		name string
		code []byte
		want int
	}{
		{"poweroff", kvmtest.ConsoleProgram("bye\n", kvmtest.ThenPowerOff), ExitPowerOff},
		{"reboot-i8042", kvmtest.ConsoleProgram("bye\n", kvmtest.ThenI8042Reset), ExitReboot},
		{"reboot-acpi", kvmtest.ConsoleProgram("bye\n", kvmtest.ThenACPIReset), ExitReboot},
		{"panic", kvmtest.ConsoleProgram("Kernel panic - not syncing: boom\n---[ end Kernel panic - not syncing: boom ]---\n",
			kvmtest.ThenHang), ExitPanic},
	}
	for _, c := range cases {
		rc, out, errOut := run("-kernel", kernel(t, c.code), "-memory", "64", "-vcpus", "2")
		if rc != c.want {
			t.Errorf("%s: exit %d, want %d; stderr %s", c.name, rc, c.want, errOut)
		}
		if !strings.Contains(out, "bye") && !strings.Contains(out, "boom") {
			t.Errorf("%s: console not on stdout: %q", c.name, out)
		}
		if c.want == ExitPanic && !strings.Contains(errOut, "Kernel panic - not syncing: boom") {
			t.Errorf("panic: stderr lacks the console tail: %q", errOut)
		}
		if c.want == ExitReboot && (!strings.Contains(errOut, "the guest reset") || !strings.Contains(errOut, "bye")) {
			t.Errorf("%s: stderr lacks how the guest reset and its console tail: %q", c.name, errOut)
		}
	}
}

// A guest reset is reported on stderr with how it reset and the console's last lines (no KVM needed).
func TestExitStatusReboot(t *testing.T) {
	var errb bytes.Buffer
	tail := strings.Repeat("old line\n", 50) + "last words\n"
	rc := exitStatus(machine.Exit{Reason: machine.ExitReboot, Err: errors.New("vcpu 0: triple fault"), ConsoleTail: tail}, &errb)
	if rc != ExitReboot {
		t.Fatalf("exit %d, want %d", rc, ExitReboot)
	}
	if s := errb.String(); !strings.Contains(s, "the guest reset (vcpu 0: triple fault)") || !strings.Contains(s, "last words") ||
		strings.Count(s, "old line") != 39 {
		t.Errorf("stderr: %q", s)
	}
}

func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage")
	os.WriteFile(garbage, []byte("not a kernel"), 0o644)
	badCfg := filepath.Join(dir, "bad.toml")
	os.WriteFile(badCfg, []byte("kernal = '/x'\n"), 0o644)
	cases := []struct {
		args []string
		want int
		msg  string
	}{
		{nil, ExitUsage, "-kernel is required"},
		{[]string{"-kernel", filepath.Join(dir, "missing")}, ExitUsage, "no such file"},
		{[]string{"-kernel", garbage, "-initrd", filepath.Join(dir, "missing")}, ExitUsage, "initrd"},
		{[]string{"-kernel", garbage, "-memory", "8"}, ExitUsage, "memory"},
		{[]string{"-kernel", garbage, "-vcpus", "0"}, ExitUsage, "vCPUs"},
		{[]string{"-bogus"}, ExitUsage, "not defined"},
		{[]string{"-kernel", garbage, "extra"}, ExitUsage, "unexpected arguments"},
		{[]string{"-config", badCfg}, ExitUsage, "kernal"},
		{[]string{"-kernel", garbage, "-console-input", "tty"}, ExitUsage, "console_input"},
		{[]string{"-kernel", garbage, "-hugetlb", "-memory", "255"}, ExitUsage, "even number of MiB"},
		{[]string{"-kernel", garbage, "-disk", garbage + ",serial=s", "-disk", badCfg + ",serial=s"}, ExitUsage, "same serial"},
		{[]string{"--help"}, 0, "Exit status:"},
	}
	for _, c := range cases {
		rc, _, errOut := run(c.args...)
		if rc != c.want || !strings.Contains(errOut, c.msg) {
			t.Errorf("%v: exit %d stderr %q; want %d and %q", c.args, rc, errOut, c.want, c.msg)
		}
	}
	needKVM(t)
	if rc, _, errOut := run("-kernel", garbage); rc != ExitFailure || !strings.Contains(errOut, "bzImage") {
		t.Errorf("garbage kernel: exit %d stderr %q", rc, errOut)
	}
}

func TestConfigFileAndFlagsOverride(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "vm.toml")
	os.WriteFile(cfgPath, []byte("kernel = '/k'\nmemory_mib = 512\nvcpus = 2\ncmdline = 'quiet'\n"), 0o644)
	cfg, err := parse([]string{"-config", cfgPath, "-vcpus", "3"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Kernel != "/k" || cfg.MemoryMiB != 512 || cfg.VCPUs != 3 || cfg.Cmdline != "quiet" || cfg.Console != "stdout" {
		t.Errorf("cfg %+v", cfg)
	}
}

func TestControlSocketStop(t *testing.T) {
	needKVM(t)
	sock := filepath.Join(t.TempDir(), "ctl.sock")
	conFile := filepath.Join(t.TempDir(), "console.log")
	done := make(chan int, 1)
	go func() {
		rc, _, _ := run("-kernel", kernel(t, kvmtest.ConsoleProgram("idle\n", kvmtest.ThenHang)),
			"-memory", "64", "-control", sock, "-console", conFile)
		done <- rc
	}()
	var c *control.Client
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		if c, err = control.Dial(t.Context(), sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("control socket never appeared: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer c.Close()
	var info struct{ State string }
	if err := c.Pause(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := c.Info(t.Context(), &info); err != nil || info.State != "paused" {
		t.Fatalf("info %+v %v", info, err)
	}
	if err := c.Resume(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Let the guest finish its line before stopping it (CPL0 code can be slow).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if b, _ := os.ReadFile(conFile); string(b) == "idle\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("console never showed the guest's line")
		}
	}
	if err := c.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case rc := <-done:
		if rc != ExitStopped {
			t.Errorf("exit %d, want %d", rc, ExitStopped)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("cube-vmm did not exit after stop")
	}
	if b, _ := os.ReadFile(conFile); string(b) != "idle\n" {
		t.Errorf("console file %q", b)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("control socket left behind: %v", err)
	}
}

func TestPanicExcerptKeepsTheReason(t *testing.T) {
	var b strings.Builder
	for i := 0; i < 30; i++ {
		b.WriteString("boot line\n")
	}
	b.WriteString("Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000300\n")
	for i := 0; i < 100; i++ {
		b.WriteString(" stack frame\n")
	}
	b.WriteString("---[ end Kernel panic - not syncing: Attempted to kill init! ]---\n")
	ex := panicExcerpt(b.String())
	if !strings.Contains(ex, "Attempted to kill init! exitcode") || !strings.Contains(ex, "---[ end") {
		t.Errorf("excerpt lost the panic reason or the end:\n%s", ex)
	}
	if n := strings.Count(ex, "\n"); n > 130 {
		t.Errorf("excerpt of %d lines", n)
	}
}

// TestVMGenIDConfig: off by default and then absent from a snapshot's
// recorded configuration (what it was before the device existed); on by
// flag or config key, and recorded so a restore rebuilds it.
func TestVMGenIDConfig(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "vm.toml")
	os.WriteFile(cfgPath, []byte("kernel = '/k'\nvmgenid = true\n"), 0o644)
	for _, c := range []struct {
		args []string
		want bool
	}{
		{[]string{"-kernel", "/k"}, false},
		{[]string{"-kernel", "/k", "-vmgenid"}, true},
		{[]string{"-config", cfgPath}, true},
		{[]string{"-config", cfgPath, "-vmgenid=false"}, false},
	} {
		cfg, err := parse(c.args, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if cfg.VMGenID != c.want {
			t.Errorf("%q: VMGenID %v, want %v", c.args, cfg.VMGenID, c.want)
		}
		j, err := json.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(j), `"VMGenID":true`); got != c.want || (!c.want && strings.Contains(string(j), "VMGenID")) {
			t.Errorf("%q: recorded configuration %s", c.args, j)
		}
		mc, closeConsole, err := machineConfig(&Config{Kernel: cfgPath, MemoryMiB: 64, VCPUs: 1, Console: "none", VMGenID: cfg.VMGenID}, nil, nil, logrus.New())
		if err != nil {
			t.Fatal(err)
		}
		closeConsole()
		if mc.VMGenID != c.want {
			t.Errorf("%q: machine config VMGenID %v", c.args, mc.VMGenID)
		}
	}
}

// TestHugeTLBConfig: off by default and then absent from a snapshot's
// recorded configuration; on by flag or config key, recorded, and handed
// to the machine beside -hugepages, which it overrides there.
func TestHugeTLBConfig(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "vm.toml")
	os.WriteFile(cfgPath, []byte("kernel = '/k'\nhugetlb = true\n"), 0o644)
	for _, c := range []struct {
		args []string
		want bool
	}{
		{[]string{"-kernel", "/k"}, false},
		{[]string{"-kernel", "/k", "-hugetlb"}, true},
		{[]string{"-kernel", "/k", "-hugetlb", "-hugepages=false"}, true},
		{[]string{"-config", cfgPath}, true},
		{[]string{"-config", cfgPath, "-hugetlb=false"}, false},
	} {
		cfg, err := parse(c.args, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if cfg.HugeTLB != c.want {
			t.Errorf("%q: HugeTLB %v, want %v", c.args, cfg.HugeTLB, c.want)
		}
		j, err := json.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(j), `"HugeTLB":true`); got != c.want || (!c.want && strings.Contains(string(j), "HugeTLB")) {
			t.Errorf("%q: recorded configuration %s", c.args, j)
		}
		cfg.Kernel, cfg.Console = cfgPath, "none"
		mc, closeConsole, err := machineConfig(&cfg, nil, nil, logrus.New())
		if err != nil {
			t.Fatal(err)
		}
		closeConsole()
		if mc.HugeTLB != c.want || mc.HugePages != cfg.HugePages {
			t.Errorf("%q: machine config HugeTLB %v HugePages %v", c.args, mc.HugeTLB, mc.HugePages)
		}
	}
}
