package vmm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cube-runtime/cube/contrib/guestimage"
	"github.com/cube-runtime/cube/hypervisor/control"
	"github.com/cube-runtime/cube/hypervisor/vmmcmd"
)

// cubeVMMArgv is the command line that runs cube-vmm (built from this checkout by TestMain) with flags.
func cubeVMMArgv(flags ...string) []string {
	return append([]string{cubeVMM}, flags...)
}

func cubeVMMCase(name string, mem, vcpus int, extra ...string) bootCase {
	return bootCase{name, cubeVMMArgv(append([]string{"-kernel", guestKernel, "-initrd", markerInitrd,
		"-cmdline", guestCmdline, "-memory", fmt.Sprint(mem), "-vcpus", fmt.Sprint(vcpus), "-rng=false"}, extra...)...)}
}

// guestInitrd writes an initramfs with busybox and the given /init script into a temp dir.
func guestInitrd(t *testing.T, init string) string {
	t.Helper()
	r := guestimage.NewInitramfs()
	if err := r.File("bin/busybox", "/bin/busybox"); err != nil {
		t.Fatal(err)
	}
	if err := r.Bytes("init", []byte(init), 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := r.WriteTo(&buf, true); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "initrd.cpio.gz")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// runVMM runs cube-vmm to completion and returns its exit status, stdout (the console) and stderr.
func runVMM(t *testing.T, timeout time.Duration, flags ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	argv := cubeVMMArgv(flags...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("cube-vmm did not finish within %v; console:\n%s\nstderr:\n%s", timeout, tail(out.String(), 40), errb.String())
	}
	rc := 0
	if ee, ok := err.(*exec.ExitError); ok {
		rc = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run cube-vmm: %v", err)
	}
	return rc, out.String(), errb.String()
}

const busyboxPrologue = `#!/bin/busybox sh
/bin/busybox mkdir -p /proc /dev
/bin/busybox mount -t devtmpfs dev /dev 2>/dev/null
/bin/busybox mount -t proc proc /proc
`

// TestCubeVMMBootsDebianKernel boots the marker guest with 1 and 2 vCPUs; the guest counts its CPUs and
// powers off, which must end cube-vmm with status 0.
func TestCubeVMMBootsDebianKernel(t *testing.T) {
	initrd := guestInitrd(t, busyboxPrologue+`echo `+bootMarker+`
echo "guest-cpus=$(/bin/busybox grep -c ^processor /proc/cpuinfo)"
/bin/busybox poweroff -f
`)
	for _, n := range []int{1, 2} {
		start := time.Now()
		rc, out, errOut := runVMM(t, 3*time.Minute, "-kernel", guestKernel, "-initrd", initrd,
			"-cmdline", guestCmdline, "-memory", "256", "-vcpus", fmt.Sprint(n), "-log-level", "debug")
		if rc != vmmcmd.ExitPowerOff {
			t.Fatalf("%d vCPUs: exit %d, want %d (poweroff)\nconsole:\n%s\nstderr:\n%s", n, rc, vmmcmd.ExitPowerOff, tail(out, 40), errOut)
		}
		if !strings.Contains(out, bootMarker) || !strings.Contains(out, fmt.Sprintf("guest-cpus=%d", n)) {
			t.Errorf("%d vCPUs: console lacks the marker or guest-cpus=%d:\n%s", n, n, tail(out, 40))
		}
		t.Logf("%d vCPUs: boot to power-off in %v", n, time.Since(start).Round(time.Millisecond))
		for _, l := range strings.Split(errOut, "\n") {
			if strings.Contains(l, "vm ended") {
				t.Logf("%d vCPUs: %s", n, l)
			}
		}
	}
}

// TestCubeVMMExitStatuses checks the documented statuses for a guest reboot and a guest kernel panic.
func TestCubeVMMExitStatuses(t *testing.T) {
	cases := []struct {
		name, init string
		want       int
		stderr     string
	}{
		{"reboot", busyboxPrologue + "/bin/busybox reboot -f\n", vmmcmd.ExitReboot, ""},
		// init exiting makes the kernel panic ("Attempted to kill init!"); panic=-1 then reboots.
		{"panic", busyboxPrologue + "exit 3\n", vmmcmd.ExitPanic, "Kernel panic - not syncing"},
	}
	for _, c := range cases {
		rc, out, errOut := runVMM(t, 3*time.Minute, "-kernel", guestKernel, "-initrd", guestInitrd(t, c.init),
			"-cmdline", guestCmdline, "-memory", "256")
		if rc != c.want {
			t.Errorf("%s: exit %d, want %d\nconsole:\n%s\nstderr:\n%s", c.name, rc, c.want, tail(out, 30), errOut)
		}
		if !strings.Contains(errOut, c.stderr) {
			t.Errorf("%s: stderr lacks %q:\n%s", c.name, c.stderr, errOut)
		}
	}
}

// BenchmarkCubeVMMVsQEMU boots the marker guest with cube-vmm and QEMU (-M pc, -M microvm) side by side,
// BOOT_RUNS (default 7) runs each, and prints the medians and ratios (goal: cube-vmm ≤ 0.5× the faster QEMU).
// A boot that stalls or crashes before the marker is counted and left out of the median: nested guests in
// the TCG test host do that now and then, under QEMU as under cube-vmm (README, "Known problems"); a case
// with fewer than 3 good boots fails the benchmark.
func BenchmarkCubeVMMVsQEMU(b *testing.B) {
	runs := 7
	if n, err := strconv.Atoi(os.Getenv("BOOT_RUNS")); err == nil && n > 0 {
		runs = n
	}
	cache := b.TempDir()
	cases := append([]bootCase{
		// Default: the guest decompresses its bzImage itself, as under QEMU.
		cubeVMMCase("cube-vmm", 256, 1),
		// cube-vmm decompresses the bzImage on the host, kept in a cache directory (first run fills it).
		cubeVMMCase("cube-vmm-vmlinux", 256, 1, "-decompress", "-kernel-cache", cache),
	}, qemuCases(256)...)
	// Round-robin, so load from other work on the machine spreads over all VMMs alike.
	runsOf := map[string][]time.Duration{}
	failed := map[string]int{}
	for i := 0; i < runs; i++ {
		for _, c := range cases {
			d, console, err := bootToMarker(context.Background(), c.argv, time.Minute)
			if err != nil {
				failed[c.name]++
				b.Logf("%s run %d: %v\n%s", c.name, i, err, console)
				continue
			}
			runsOf[c.name] = append(runsOf[c.name], d)
		}
	}
	medians := map[string]time.Duration{}
	for _, c := range cases {
		if len(runsOf[c.name]) < 3 {
			b.Fatalf("%s: only %d of %d boots reached the marker", c.name, len(runsOf[c.name]), runs)
		}
		medians[c.name] = median(runsOf[c.name])
		b.Logf("%s: runs %v", c.name, runsOf[c.name])
	}
	best := min(medians["qemu-pc"], medians["qemu-microvm"])
	b.ReportMetric(float64(medians["cube-vmm"].Milliseconds()), "cube-vmm-ms")
	fmt.Printf("\n%-18s %12s %16s %8s %8s\n", "vmm", "median", "vs faster qemu", "boots", "failed")
	for _, c := range cases {
		fmt.Printf("%-18s %12v %15.2fx %8d %8d\n", c.name, medians[c.name].Round(time.Millisecond),
			float64(medians[c.name])/float64(best), len(runsOf[c.name]), failed[c.name])
	}
}

// startVMM starts cube-vmm and returns once its console shows bootMarker; the caller stops it.
func startVMM(t testing.TB, flags ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	argv := cubeVMMArgv(flags...)
	cmd := exec.Command(argv[0], argv[1:]...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for !strings.Contains(out.String(), bootMarker) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("no marker within 3 minutes:\n%s", tail(out.String(), 40))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return cmd, out
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestCubeVMMControlSocket pauses and resumes a running Linux guest through the control socket, then stops it.
// The guest prints a counter every 100 ms; while paused it must not advance.
func TestCubeVMMControlSocket(t *testing.T) {
	initrd := guestInitrd(t, busyboxPrologue+`echo `+bootMarker+`
i=0; while true; do i=$((i+1)); echo "tick $i"; /bin/busybox usleep 100000; done
`)
	sock := filepath.Join(t.TempDir(), "ctl.sock")
	cmd, out := startVMM(t, "-kernel", guestKernel, "-initrd", initrd, "-cmdline", guestCmdline, "-memory", "256",
		"-control", sock)
	defer cmd.Process.Kill()
	c, err := control.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: timed out; console:\n%s", what, tail(out.String(), 20))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("first ticks", func() bool { return strings.Count(out.String(), "tick ") >= 3 })
	if err := c.Pause(); err != nil {
		t.Fatal(err)
	}
	var info struct{ State string }
	if err := c.Info(&info); err != nil || info.State != "paused" {
		t.Fatalf("info after pause: %+v %v", info, err)
	}
	n := strings.Count(out.String(), "tick ")
	time.Sleep(1500 * time.Millisecond)
	if m := strings.Count(out.String(), "tick "); m > n+1 { // one line may be in flight
		t.Errorf("guest printed %d ticks while paused", m-n)
	}
	if err := c.Resume(); err != nil {
		t.Fatal(err)
	}
	waitFor("ticks after resume", func() bool { return strings.Count(out.String(), "tick ") >= n+5 })
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != vmmcmd.ExitStopped {
		t.Errorf("cube-vmm after stop: %v, want exit %d", err, vmmcmd.ExitStopped)
	}
}

// BenchmarkCubeVMMMemoryOverhead reports cube-vmm's resident memory beyond guest RAM (goal ≤ 10 MiB) for a
// booted 256 MiB guest: the RSS of every mapping except the guest RAM mapping, from /proc/PID/smaps.
func BenchmarkCubeVMMMemoryOverhead(b *testing.B) {
	dir := b.TempDir()
	r := guestimage.NewInitramfs()
	r.File("bin/busybox", "/bin/busybox")
	r.Bytes("init", []byte(busyboxPrologue+"echo "+bootMarker+"\n/bin/busybox sleep 30\n/bin/busybox poweroff -f\n"), 0o755)
	var buf bytes.Buffer
	r.WriteTo(&buf, true)
	initrd := filepath.Join(dir, "initrd.gz")
	os.WriteFile(initrd, buf.Bytes(), 0o644)
	const memMiB = 256
	cmd, _ := startVMM(b, "-kernel", guestKernel, "-initrd", initrd, "-cmdline", guestCmdline, "-memory", fmt.Sprint(memMiB))
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	// cmd is cube-vmm itself, so the pid is the VMM's.
	smaps, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	var total, guest, size int64
	for _, line := range strings.Split(string(smaps), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "Size:" {
			fmt.Sscan(f[1], &size)
		}
		if len(f) >= 2 && f[0] == "Rss:" {
			var kb int64
			fmt.Sscan(f[1], &kb)
			total += kb
			// The guest RAM mapping, possibly merged with a small neighbouring mapping.
			if size >= memMiB<<10 && size <= memMiB<<10+4096 {
				guest += kb
			}
		}
	}
	b.ReportMetric(float64(total-guest)/1024, "vmm-rss-MiB")
	b.ReportMetric(float64(guest)/1024, "guest-rss-MiB")
	fmt.Printf("\ncube-vmm RSS: %.1f MiB total, %.1f MiB guest RAM touched, %.1f MiB VMM overhead\n",
		float64(total)/1024, float64(guest)/1024, float64(total-guest)/1024)
}

// TestCubeVMMHostDecompressedKernel boots the Debian bzImage decompressed by cube-vmm (its vmlinux loaded
// directly), twice: the second boot maps the cached vmlinux.
func TestCubeVMMHostDecompressedKernel(t *testing.T) {
	initrd := guestInitrd(t, busyboxPrologue+"echo "+bootMarker+"\n/bin/busybox poweroff -f\n")
	cache := t.TempDir()
	for i := 0; i < 2; i++ {
		rc, out, errOut := runVMM(t, 3*time.Minute, "-kernel", guestKernel, "-initrd", initrd, "-cmdline", guestCmdline,
			"-decompress", "-kernel-cache", cache, "-log-level", "debug")
		if rc != vmmcmd.ExitPowerOff || !strings.Contains(out, bootMarker) {
			t.Fatalf("boot %d: exit %d\nconsole:\n%s\nstderr:\n%s", i, rc, tail(out, 30), errOut)
		}
		if cached := strings.Contains(errOut, "kernel from cache"); cached != (i == 1) {
			t.Errorf("boot %d: from cache = %v", i, cached)
		}
	}
}
