package machine

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/hypervisor/kvm"
	"github.com/cube-runtime/cube/hypervisor/kvmtest"
)

func synthKernel(t *testing.T, code []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kernel")
	if err := os.WriteFile(p, kvmtest.SyntheticBzImage(code), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

var (
	printThen     = kvmtest.ConsoleProgram
	tailPowerOff  = kvmtest.ThenPowerOff
	tailI8042     = kvmtest.ThenI8042Reset
	tailACPIReset = kvmtest.ThenACPIReset
	tailHang      = kvmtest.ThenHang
)

func runMachine(t *testing.T, code []byte, vcpus int, cons *bytes.Buffer) (*Machine, Exit) {
	t.Helper()
	m := newMachine(t, code, vcpus, cons)
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Done():
	case <-time.After(60 * time.Second):
		m.Stop()
		t.Fatalf("guest did not end within 60s; console %q", cons.String())
	}
	return m, m.Wait()
}

func newMachine(t *testing.T, code []byte, vcpus int, cons *bytes.Buffer) *Machine {
	t.Helper()
	m, err := New(Config{Kernel: synthKernel(t, code), Cmdline: "console=ttyS0", MemoryMiB: 64, VCPUs: vcpus,
		Console: cons, PanicGrace: 100 * time.Millisecond})
	if errors.Is(err, fs.ErrNotExist) {
		t.Skipf("no KVM device: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func TestPowerOff(t *testing.T) {
	var cons bytes.Buffer
	_, exit := runMachine(t, printThen("hello from the guest\n", tailPowerOff), 2, &cons)
	if exit.Reason != ExitPowerOff || exit.Err != nil {
		t.Errorf("exit %+v, want poweroff", exit)
	}
	if cons.String() != "hello from the guest\n" || exit.ConsoleTail != cons.String() {
		t.Errorf("console %q tail %q", cons.String(), exit.ConsoleTail)
	}
}

func TestReboot(t *testing.T) {
	for name, tail := range map[string][]byte{"i8042": tailI8042, "acpi": tailACPIReset} {
		var cons bytes.Buffer
		_, exit := runMachine(t, printThen("bye\n", tail), 1, &cons)
		if exit.Reason != ExitReboot {
			t.Errorf("%s: exit %+v, want reboot", name, exit)
		}
	}
}

func TestPanicDetected(t *testing.T) {
	msg := "Kernel panic - not syncing: VFS: Unable to mount root fs\nCPU: 0 PID: 1\n---[ end Kernel panic - not syncing: VFS ]---\n"
	var cons bytes.Buffer
	_, exit := runMachine(t, printThen(msg, tailHang), 1, &cons)
	if exit.Reason != ExitPanic || !strings.Contains(exit.ConsoleTail, "Unable to mount root fs") {
		t.Errorf("exit %+v", exit)
	}
	// Without the end marker, the grace timer ends it.
	cons.Reset()
	_, exit = runMachine(t, printThen("Kernel panic - not syncing: Attempted to kill init!\n", tailHang), 1, &cons)
	if exit.Reason != ExitPanic {
		t.Errorf("exit %+v", exit)
	}
	// A reboot after a panic (panic=-1) still reports the panic.
	cons.Reset()
	_, exit = runMachine(t, printThen("Kernel panic - not syncing: x\n", tailACPIReset), 1, &cons)
	if exit.Reason != ExitPanic {
		t.Errorf("panic then reboot: exit %+v", exit)
	}
}

func TestPauseResumeStopInfo(t *testing.T) {
	var cons bytes.Buffer
	m := newMachine(t, printThen("up\n", tailHang), 2, &cons)
	if err := m.Resume(); err == nil {
		t.Error("Resume before Start accepted")
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err == nil {
		t.Error("second Start accepted")
	}
	for i := 0; i < 3; i++ {
		if err := m.Pause(); err != nil {
			t.Fatal(err)
		}
		if s := m.Info().State; s != "paused" {
			t.Fatalf("state %s after pause", s)
		}
		if err := m.Resume(); err != nil {
			t.Fatal(err)
		}
	}
	info := m.Info()
	if info.State != "running" || info.VCPUs != 2 || len(info.PIO) != 3 {
		t.Errorf("info %+v", info)
	}
	m.Stop()
	if exit := m.Wait(); exit.Reason != ExitStopped {
		t.Errorf("exit %+v", exit)
	}
	if err := m.Pause(); err == nil {
		t.Error("Pause after Stop accepted")
	}
}

func TestConfigErrors(t *testing.T) {
	for name, c := range map[string]Config{
		"no kernel":      {},
		"missing kernel": {Kernel: "/nonexistent/vmlinuz"},
		"tiny memory":    {Kernel: "/x", MemoryMiB: 1},
		"vcpus":          {Kernel: "/x", VCPUs: 300},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	notKernel := filepath.Join(t.TempDir(), "k")
	os.WriteFile(notKernel, []byte("not a kernel"), 0o644)
	if _, err := New(Config{Kernel: notKernel, KVMDevice: kvm.DefaultDevice}); err == nil || !strings.Contains(err.Error(), "bzImage") {
		t.Errorf("garbage kernel: %v", err)
	}
}

// TestRealModeResetReboots starts the boot vCPU in real mode at the reset
// vector, where Linux's BIOS reboot lands: the stub there must turn it
// into a reboot.
func TestRealModeResetReboots(t *testing.T) {
	var cons bytes.Buffer
	m := newMachine(t, printThen("unused\n", tailHang), 1, &cons)
	cpu := m.cpus[0].CPU
	s, err := cpu.GetSregs()
	if err != nil {
		t.Fatal(err)
	}
	real16 := kvm.Segment{Base: 0xf0000, Limit: 0xffff, Selector: 0xf000, Type: 0xb, Present: 1, S: 1}
	data16 := kvm.Segment{Limit: 0xffff, Type: 0x3, Present: 1, S: 1}
	s.CS = real16
	s.DS, s.ES, s.FS, s.GS, s.SS = data16, data16, data16, data16, data16
	s.CR0, s.CR4, s.EFER = 0x10, 0, 0
	if err := cpu.SetSregs(s); err != nil {
		t.Fatal(err)
	}
	if err := cpu.SetRegs(kvm.Regs{RIP: 0xfff0, RFLAGS: 2}); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Done():
	case <-time.After(60 * time.Second):
		m.Stop()
		t.Fatal("guest did not end")
	}
	if exit := m.Wait(); exit.Reason != ExitReboot {
		t.Errorf("exit %+v, want reboot", exit)
	}
}
