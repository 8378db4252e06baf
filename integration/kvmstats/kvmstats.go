// Package kvmstats reads the test host's per-VM KVM counters from debugfs
// (/sys/kernel/debug/kvm/TID-FD/, TID the thread that created the VM: for a
// Go VMM any of its threads), for the benchmarks' breakdowns.
package kvmstats

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

const debugfs = "/sys/kernel/debug"

// Mount mounts debugfs unless KVM's directory is there already; undo
// unmounts what Mount mounted (nothing otherwise).
func Mount() (undo func(), err error) {
	if _, err := os.Stat(filepath.Join(debugfs, "kvm")); err == nil {
		return func() {}, nil
	}
	if err := syscall.Mount("debugfs", debugfs, "debugfs", 0, ""); err != nil {
		return func() {}, fmt.Errorf("mount debugfs (for KVM counters): %w", err)
	}
	return func() { syscall.Unmount(debugfs, 0) }, nil
}

// VMDirs lists the directories of every KVM VM.
func VMDirs() []string {
	dirs, _ := filepath.Glob(filepath.Join(debugfs, "kvm", "*-*"))
	return dirs
}

// OfProcess lists the directories of the VMs that process pid created.
func OfProcess(pid int) []string {
	var out []string
	for _, d := range VMDirs() {
		tid, _, _ := strings.Cut(filepath.Base(d), "-")
		if _, err := os.Stat(filepath.Join("/proc", fmt.Sprint(pid), "task", tid)); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// Read sums the named counters over dirs (a VM directory holds the sums
// of its vCPUs'); a counter that cannot be read is left out.
func Read(names []string, dirs ...string) map[string]int64 {
	c := map[string]int64{}
	for _, d := range dirs {
		for _, k := range names {
			b, err := os.ReadFile(filepath.Join(d, k))
			if err != nil {
				continue
			}
			if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
				c[k] += v
			}
		}
	}
	return c
}

const (
	exitTrigger = "hist:keys=exit_reason:sort=hitcount:size=256"
	msrTrigger  = "hist:keys=ecx:sort=hitcount:size=256"
	// npfTrigger counts nested page faults by the power of two of their
	// guest address: below 1 GiB is the RAM of a guest that small, above
	// it the device MMIO (virtio notifications through ioeventfd count as
	// page faults too).
	npfTrigger = "hist:keys=fault_address.log2:sort=hitcount:size=128"
)

// ExitReasons counts every KVM exit in the test host by its reason, and
// the MSR accesses among them by MSR, from now until stop (hist triggers
// on the kvm:kvm_exit and kvm:kvm_msr tracepoints, so all VMs count: run
// one at a time). stop removes the triggers and returns the counts by SVM
// exit code name (numbers for codes it does not name), and by "msr 0x…".
func ExitReasons() (stop func() (map[string]int64, error), err error) {
	evs := []trigger{{"kvm_exit", exitTrigger}, {"kvm_msr", msrTrigger}, {"kvm_page_fault", npfTrigger}}
	if err := addTriggers(evs); err != nil {
		return nil, fmt.Errorf("count KVM exits by reason: %w", err)
	}
	return func() (map[string]int64, error) {
		out := map[string]int64{}
		hists, err := removeTriggers(evs)
		for ev, h := range hists {
			for k, v := range parseHist(h, ev) {
				out[k] += v
			}
		}
		return out, err
	}, nil
}

// trigger is a hist trigger on one kvm tracepoint.
type trigger struct{ event, spec string }

func triggerFile(ev, name string) string {
	return filepath.Join(debugfs, "tracing", "events", "kvm", ev, name)
}

// addTriggers adds every trigger, or none (those added are removed again).
func addTriggers(ts []trigger) error {
	for i, t := range ts {
		if err := writeTrigger(triggerFile(t.event, "trigger"), t.spec); err != nil {
			removeTriggers(ts[:i])
			return fmt.Errorf("%s: %w", t.event, err)
		}
	}
	return nil
}

// removeTriggers reads the histogram of each event the triggers are on,
// once (an event's file holds all of its triggers' sections), then removes
// the triggers; the first error is returned with what could be read.
func removeTriggers(ts []trigger) (map[string]string, error) {
	hists := map[string]string{}
	var first error
	for _, t := range ts {
		if _, done := hists[t.event]; done {
			continue
		}
		b, err := os.ReadFile(triggerFile(t.event, "hist"))
		hists[t.event] = string(b)
		if err != nil && first == nil {
			first = fmt.Errorf("read the %s histogram: %w", t.event, err)
		}
	}
	for _, t := range ts {
		writeTrigger(triggerFile(t.event, "trigger"), "!"+t.spec)
	}
	return hists, first
}

// histField is the key of our trigger on each event.
var histField = map[string]string{"kvm_exit": "exit_reason", "kvm_msr": "ecx", "kvm_page_fault": "fault_address"}

// svmExits names the SVM exit codes a Linux guest causes most.
var svmExits = map[int64]string{
	0x60: "intr", 0x61: "nmi", 0x64: "vintr", 0x72: "cpuid", 0x74: "iret", 0x77: "pause",
	0x78: "hlt", 0x79: "invlpg", 0x7b: "ioio", 0x7c: "msr", 0x7f: "shutdown", 0x81: "vmmcall",
	0x8d: "xsetbv", 0x400: "npf", 0x401: "avic_ipi", 0x402: "avic_noaccel",
}

// parseHist reads a hist trigger's lines of event ev: "{ exit_reason: N }
// hitcount: M", for kvm_msr "{ ecx: N } …", for kvm_page_fault
// "{ fault_address: ~ 2^N } …" (counted as "npf < 1 GiB" or "npf ≥ 1 GiB").
func parseHist(s, ev string) map[string]int64 {
	out := map[string]int64{}
	for _, line := range strings.Split(s, "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		key, rest, ok := strings.Cut(strings.TrimPrefix(line, "{"), "}")
		if !ok {
			continue
		}
		field, code, _ := strings.Cut(key, ":")
		_, hits, _ := strings.Cut(rest, "hitcount:")
		n, err := strconv.ParseInt(strings.TrimSpace(hits), 10, 64)
		if err != nil || strings.TrimSpace(field) != histField[ev] {
			continue // another trigger's section of the same event
		}
		if ev == "kvm_page_fault" {
			_, exp, _ := strings.Cut(code, "^")
			if e, err := strconv.Atoi(strings.TrimSpace(exp)); err == nil && e <= 30 {
				out["npf < 1 GiB"] += n
			} else {
				out["npf ≥ 1 GiB"] += n
			}
			continue
		}
		c, err := strconv.ParseInt(strings.TrimSpace(code), 10, 64)
		if err != nil {
			continue
		}
		name, ok := svmExits[c]
		if ev == "kvm_msr" {
			name = fmt.Sprintf("msr %#x", c)
		} else if !ok {
			name = fmt.Sprintf("%#x", c)
		}
		out[name] += n
	}
	return out
}

// RIPs samples where the guest was when it exited, by exit reason: intr
// exits (the host's interrupts: a sample of where guest time goes) and
// npf exits (where it first touches memory). From now until stop, for
// every VM of the test host; stop returns guest RIP → count for each.
func RIPs() (stop func() (intr, npf map[uint64]int64, err error), err error) {
	ts := []trigger{
		{"kvm_exit", "hist:keys=guest_rip.hex:sort=hitcount:size=8192 if exit_reason == 96"},
		{"kvm_exit", "hist:keys=guest_rip.hex:sort=hitcount:size=16384 if exit_reason == 1024"},
	}
	if err := addTriggers(ts); err != nil {
		return nil, fmt.Errorf("sample guest RIPs: %w", err)
	}
	return func() (map[uint64]int64, map[uint64]int64, error) {
		hists, err := removeTriggers(ts)
		if err != nil {
			return nil, nil, err
		}
		intr, npf, err := parseRIPHists(hists["kvm_exit"])
		if err == nil && len(intr) == 0 && len(npf) == 0 {
			head := hists["kvm_exit"]
			if len(head) > 3000 {
				head = head[:3000]
			}
			err = fmt.Errorf("no guest RIPs in the histograms:\n%s", head)
		}
		return intr, npf, err
	}, nil
}

// parseRIPHists reads the hist file of two triggers, each section opening
// with its "# trigger info: … if exit_reason == N" line.
func parseRIPHists(s string) (intr, npf map[uint64]int64, err error) {
	intr, npf = map[uint64]int64{}, map[uint64]int64{}
	var cur map[uint64]int64
	for _, line := range strings.Split(s, "\n") {
		switch {
		case strings.HasPrefix(line, "# trigger info:"):
			cur = nil
			if strings.Contains(line, "exit_reason == 96") {
				cur = intr
			} else if strings.Contains(line, "exit_reason == 1024") {
				cur = npf
			}
		case strings.HasPrefix(line, "{") && cur != nil:
			key, rest, _ := strings.Cut(strings.TrimPrefix(line, "{"), "}")
			_, v, _ := strings.Cut(key, ":")
			_, hits, _ := strings.Cut(rest, "hitcount:")
			rip, err1 := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(v), "0x"), 16, 64)
			n, err2 := strconv.ParseInt(strings.TrimSpace(hits), 10, 64)
			if err1 == nil && err2 == nil {
				cur[rip] += n
			}
		}
	}
	return intr, npf, nil
}

// writeTrigger adds (or, "!…", removes) one trigger of an event. Not
// os.WriteFile: opening a trigger file with O_TRUNC removes every hist
// trigger of the event, other callers' included.
func writeTrigger(path, trigger string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(trigger)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
