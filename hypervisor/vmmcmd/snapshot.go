package vmmcmd

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/cube-runtime/cube/hypervisor/control"
	"github.com/cube-runtime/cube/hypervisor/machine"
	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// components hashes the kernel and initrd in the background (a snapshot
// records them; under TCG hashing tens of MiB takes a while) and returns a
// function that waits for the result.
func components(cfg *Config) func() (snapshot.Components, error) {
	var (
		once sync.Once
		c    = snapshot.Components{VMMVersion: snapshot.VMMVersion()}
		err  error
		done = make(chan struct{})
	)
	kernel, initrd := cfg.Kernel, cfg.Initrd
	go once.Do(func() {
		defer close(done)
		if c.KernelSHA256, err = sha256File(kernel); err != nil {
			return
		}
		if initrd != "" {
			c.InitrdSHA256, err = sha256File(initrd)
		}
	})
	return func() (snapshot.Components, error) {
		<-done
		return c, err
	}
}

func sha256File(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// snapTarget adds snapshot, rollback and disk-set to the control socket's
// target.
type snapTarget struct {
	target
	comps func() (snapshot.Components, error)
	// mu serializes disk-set with snapshot and rollback, and guards cfg:
	// its disk paths follow disk-set, so a snapshot's configuration (what
	// restore attaches) names the files the drives have now.
	mu  sync.Mutex
	cfg Config
}

func newTarget(m *machine.Machine, cfg Config, comps func() (snapshot.Components, error)) *snapTarget {
	cfg.Disks = append([]Disk(nil), cfg.Disks...)
	return &snapTarget{target: target{m}, cfg: cfg, comps: comps}
}

// SetDisk re-points the drive with serial at path (control op disk-set).
func (t *snapTarget) SetDisk(serial, path string, readOnly bool) (*control.DiskSetResult, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	sectors, err := setDiskPath(t.m, t.cfg.Disks, serial, path, readOnly)
	if err != nil {
		return nil, err
	}
	return &control.DiskSetResult{Serial: serial, Path: path, Sectors: sectors}, nil
}

// setDiskPath re-points the drive with serial at path and records the path
// in disks: a later snapshot's configuration (what its restore attaches)
// then names the file the drive has now.
func setDiskPath(m *machine.Machine, disks []Disk, serial, path string, readOnly bool) (uint64, error) {
	sectors, err := m.SetDiskMode(serial, path, readOnly)
	if err != nil {
		return 0, err
	}
	for i := range disks {
		if disks[i].Serial == serial {
			disks[i].Path = path
			break
		}
	}
	return sectors, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func (t *snapTarget) Snapshot(dir string, incremental bool) (*control.SnapshotResult, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, err := t.comps()
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	cfg, err := json.Marshal(t.cfg)
	if err != nil {
		return nil, err
	}
	st, err := t.m.Snapshot(dir, machine.SnapshotOptions{Components: c, Config: cfg, Incremental: incremental})
	if err != nil {
		return nil, err
	}
	return &control.SnapshotResult{Dir: dir, FrozenMS: ms(st.Frozen), TotalMS: ms(st.Total), PrecopyMS: ms(st.Precopy),
		MemoryBytes: st.MemoryBytes, RecopiedBytes: st.RecopiedBytes, DiskBytes: st.DiskBytes, Reflinked: st.Reflinked}, nil
}

func (t *snapTarget) Rollback(dir string) (*control.RollbackResult, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	snap, err := snapshot.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("rollback: %w", err)
	}
	c, err := t.comps()
	if err != nil {
		return nil, fmt.Errorf("rollback: %w", err)
	}
	if err := snap.Manifest.CheckComponents(c); err != nil {
		return nil, fmt.Errorf("rollback to %s: %w", dir, err)
	}
	st, err := t.m.Rollback(snap)
	if err != nil {
		return nil, err
	}
	return &control.RollbackResult{Dir: dir, PrepareMS: ms(st.Prepare), FrozenMS: ms(st.Frozen), TotalMS: ms(st.Total),
		Memory: st.Memory, Pages: st.Pages}, nil
}

// exitStatus maps how the guest ended to cube-vmm's exit status.
func exitStatus(exit machine.Exit, stderr io.Writer) int {
	switch exit.Reason {
	case machine.ExitPowerOff:
		return ExitPowerOff
	case machine.ExitReboot:
		// cube-vmm does not restart a guest, and the benchmarks' and sandboxes' guests never reboot on
		// purpose: say how it reset and what it printed last (the console file goes with the sandbox).
		tail := lastLines(exit.ConsoleTail, 40)
		if strings.TrimSpace(tail) == "" {
			tail = "(nothing on the console since the VM started or was restored)"
		}
		fmt.Fprintf(stderr, "cube-vmm: the guest reset (%v); console tail:\n%s\n", exit.Err, tail)
		return ExitReboot
	case machine.ExitStopped:
		return ExitStopped
	case machine.ExitPanic:
		fmt.Fprintf(stderr, "cube-vmm: guest kernel panic; console tail:\n%s\n", panicExcerpt(exit.ConsoleTail))
		return ExitPanic
	default:
		fmt.Fprintf(stderr, "cube-vmm: %v\nconsole tail:\n%s\n", exit.Err, lastLines(exit.ConsoleTail, 40))
		return ExitFailure
	}
}
