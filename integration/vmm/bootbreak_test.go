package vmm

import (
	"bufio"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/kvmstats"
)

// What BenchmarkCubeVMMVsQEMU prints below its table: where one boot to the marker goes, for cube-vmm and
// QEMU -M pc, from the test host's KVM counters of the VM (debugfs, integration/kvmstats, read while
// the guest holds after the marker: a VM's counters go with it) and cube-vmm's own debug log (exec → machine
// built → first KVM_RUN). Diagnostics, not a pass/fail: a boot that does not reach the marker is reported.

// kvmCounters are the per-VM KVM statistics shown, in order.
var kvmCounters = []string{"exits", "io_exits", "mmio_exits", "halt_exits", "irq_exits", "irq_window_exits",
	"request_irq_exits", "insn_emulation", "pf_taken", "pf_guest", "hypercalls", "irq_injections", "host_state_reload",
	// Nested (NPT) mappings of guest RAM at the marker, by size: 2 MiB ones only where the host memory
	// behind is 2 MiB pages (hugetlb; THP is off in the test host).
	"pages_4k", "pages_2m"}

// bootBreakdown boots each of argvs once (holding after the marker) and prints the breakdown.
func bootBreakdown(b *testing.B, argvs map[string][]string) {
	if umount, err := kvmstats.Mount(); err != nil {
		b.Logf("boot breakdown: %v (no KVM counters)", err)
	} else {
		defer umount()
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range argvs {
			if !yield(n) {
				return
			}
		}
	})
	rows := map[string]map[string]int64{}
	notes := map[string]string{}
	for _, name := range names {
		c, note, err := holdBoot(argvs[name])
		if err != nil {
			b.Logf("boot breakdown, %s: %v", name, err)
			continue
		}
		rows[name], notes[name] = c, note
	}
	fmt.Printf("\nOne boot to the marker each, KVM counters of the VM (test host debugfs) at the marker:\n\n| counter |")
	for _, n := range names {
		fmt.Printf(" %s |", n)
	}
	fmt.Printf("\n|---|%s\n", strings.Repeat("---|", len(names)))
	for _, k := range append([]string{"marker_ms", "hugetlb_pages"}, kvmCounters...) {
		fmt.Printf("| %s |", k)
		for _, n := range names {
			if v, ok := rows[n][k]; ok {
				fmt.Printf(" %d |", v)
			} else {
				fmt.Printf(" – |")
			}
		}
		fmt.Println()
	}
	for _, n := range names {
		if notes[n] != "" {
			fmt.Printf("%s: %s\n", n, notes[n])
		}
	}
}

// holdBoot starts argv (its guest holds after the marker: cube_hold=1), waits for the marker, reads the VM's
// KVM counters and, for cube-vmm, its log's steps, then kills it.
func holdBoot(argv []string) (map[string]int64, string, error) {
	argv = holdArgv(argv)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	stop := func() {
		// SIGTERM first: cube-vmm then logs its exits by device ("vm ended"); QEMU just ends.
		syscall.Kill(cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
		}
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}
	found := make(chan time.Duration, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.Contains(sc.Text(), bootMarker) {
				found <- time.Since(start)
			}
		}
		close(found)
	}()
	var took time.Duration
	select {
	case d, ok := <-found:
		if !ok {
			stop()
			return nil, "", fmt.Errorf("exited before the marker: %s", tail(stderr.String(), 10))
		}
		took = d
	case <-time.After(2 * time.Minute):
		stop()
		return nil, "", fmt.Errorf("no marker in 2 minutes: %s", tail(stderr.String(), 10))
	}
	c := kvmstats.Read(kvmCounters, kvmstats.OfProcess(cmd.Process.Pid)...)
	c["marker_ms"] = took.Milliseconds()
	// Pages of the 2 MiB hugetlb pool the VM holds (touched or reserved); other VMs of the benchmark are gone.
	if p, err := hugePoolNow(); err == nil {
		c["hugetlb_pages"] = p.held()
	}
	stop()
	return c, cubeVMMSteps(stderr.String(), start), nil
}

// holdArgv adds cube_hold=1 to argv's kernel command line (-cmdline for cube-vmm, -append for QEMU) and, for
// cube-vmm, debug logging.
func holdArgv(argv []string) []string {
	a := slices.Clone(argv)
	for i := 0; i+1 < len(a); i++ {
		if a[i] == "-cmdline" || a[i] == "-append" {
			a[i+1] += " cube_hold=1"
		}
	}
	if a[0] == cubeVMM {
		a = append(a, "-log-level", "debug")
	}
	return a
}

var logTime = regexp.MustCompile(`time="(\d\d:\d\d:\d\d\.\d+)"`)

// cubeVMMSteps reads cube-vmm's debug log: the time from exec to "machine built" and to "starting vcpus"
// (the first KVM_RUN follows at once), and what the machine build took inside the process.
func cubeVMMSteps(log string, start time.Time) string {
	var parts []string
	day := start.Truncate(24 * time.Hour)
	for _, l := range strings.Split(log, "\n") {
		var what string
		switch {
		case strings.Contains(l, `msg="machine built"`):
			what = "exec→machine built"
			if m := regexp.MustCompile(`took=(\S+)`).FindStringSubmatch(l); m != nil {
				parts = append(parts, "machine build (in process) "+m[1])
			}
		case strings.Contains(l, `msg="starting vcpus"`):
			what = "exec→first KVM_RUN"
		case strings.Contains(l, `msg="vm ended"`):
			// Exits to cube-vmm up to the stop (the held guest idles after the marker), by device.
			if i := strings.Index(l, "exits_interrupted="); i >= 0 {
				parts = append(parts, "at the stop: "+l[i:])
			}
			continue
		default:
			continue
		}
		if m := logTime.FindStringSubmatch(l); m != nil {
			if t, err := time.ParseInLocation("15:04:05.000000", m[1], start.Location()); err == nil {
				at := day.Add(time.Duration(t.Hour())*time.Hour + time.Duration(t.Minute())*time.Minute +
					time.Duration(t.Second())*time.Second + time.Duration(t.Nanosecond()))
				parts = append(parts, fmt.Sprintf("%s %v", what, at.Sub(start).Round(time.Millisecond)))
			}
		}
	}
	return strings.Join(parts, ", ")
}
