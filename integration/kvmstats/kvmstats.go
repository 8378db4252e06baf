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
