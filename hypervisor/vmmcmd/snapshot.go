package vmmcmd

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/checkpoint"
	"github.com/cube-runtime/cube/hypervisor/control"
	"github.com/cube-runtime/cube/hypervisor/machine"
)

// Version identifies this VMM in snapshot manifests; a snapshot is
// restored or rolled back to only by the same version (the device and
// machine state layouts are this build's).
const Version = "cube-vmm/1 state/1"

// components hashes the kernel and initrd in the background (a snapshot
// records them; under TCG hashing tens of MiB takes a while) and returns a
// function that waits for the result.
func components(cfg *Config) func() (checkpoint.Components, error) {
	var (
		once sync.Once
		c    = checkpoint.Components{VMMVersion: Version}
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
	return func() (checkpoint.Components, error) {
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
	comps func() (checkpoint.Components, error)
	// mu serializes disk-set with snapshot and rollback, and guards cfg:
	// its disk paths follow disk-set, so a snapshot's configuration (what
	// restore attaches) names the files the drives have now.
	mu  sync.Mutex
	cfg Config
}

func newTarget(m *machine.Machine, cfg Config, comps func() (checkpoint.Components, error)) *snapTarget {
	cfg.Disks = append([]Disk(nil), cfg.Disks...)
	return &snapTarget{target: target{m}, cfg: cfg, comps: comps}
}

// diskSetResult is the disk-set op's result.
type diskSetResult struct {
	Serial  string `json:"serial"`
	Path    string `json:"path"`
	Sectors uint64 `json:"sectors"`
}

// SetDisk re-points the drive with serial at path (control op disk-set).
func (t *snapTarget) SetDisk(serial, path string) (json.RawMessage, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	sectors, err := t.m.SetDisk(serial, path)
	if err != nil {
		return nil, err
	}
	for i := range t.cfg.Disks {
		if t.cfg.Disks[i].Serial == serial {
			t.cfg.Disks[i].Path = path
			break
		}
	}
	return json.Marshal(diskSetResult{Serial: serial, Path: path, Sectors: sectors})
}

// Figures reported by the snapshot and rollback ops, in milliseconds.
type snapshotResult struct {
	Dir         string  `json:"dir"`
	FrozenMS    float64 `json:"frozen_ms"`
	TotalMS     float64 `json:"total_ms"`
	MemoryBytes int64   `json:"memory_bytes"`
	DiskBytes   int64   `json:"disk_bytes"`
	Reflinked   bool    `json:"reflinked"`
}

type rollbackResult struct {
	Dir       string  `json:"dir"`
	PrepareMS float64 `json:"prepare_ms"`
	FrozenMS  float64 `json:"frozen_ms"`
	TotalMS   float64 `json:"total_ms"`
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func (t *snapTarget) Snapshot(dir string, incremental bool) (json.RawMessage, error) {
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
	return json.Marshal(snapshotResult{Dir: dir, FrozenMS: ms(st.Frozen), TotalMS: ms(st.Total),
		MemoryBytes: st.MemoryBytes, DiskBytes: st.DiskBytes, Reflinked: st.Reflinked})
}

func (t *snapTarget) Rollback(dir string) (json.RawMessage, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	snap, err := checkpoint.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("rollback: %w", err)
	}
	c, err := t.comps()
	if err != nil {
		return nil, fmt.Errorf("rollback: %w", err)
	}
	if err := snap.Manifest.Check(snap.Manifest.Shape, c); err != nil {
		return nil, fmt.Errorf("rollback to %s: %w", dir, err)
	}
	st, err := t.m.Rollback(snap)
	if err != nil {
		return nil, err
	}
	return json.Marshal(rollbackResult{Dir: dir, PrepareMS: ms(st.Prepare), FrozenMS: ms(st.Frozen), TotalMS: ms(st.Total)})
}

const restoreUsage = `Usage: cube-vmm restore [flags] SNAPSHOT-DIR

Starts a VM from a snapshot directory written by the control socket's
snapshot op. Guest memory is mapped copy-on-write from the snapshot (the
snapshot never changes); writable disks get working copies (reflinked when
the filesystem can) at their recorded paths, or in -disk-dir. The guest's
vsock connections are reset; its agent reconnects.

Exit statuses as for cube-vmm; a snapshot that cannot be used exits 1.

Flags (default: what the snapshotted VMM had):
`

// runRestore is "cube-vmm restore".
func runRestore(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cube-vmm restore", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, restoreUsage)
		fs.PrintDefaults()
	}
	controlPath := fs.String("control", "", "control socket `path`")
	vsockPath := fs.String("vsock", "", "hybrid vsock Unix socket `path`")
	console := fs.String("console", "", "serial console output: stdout, none, or a file `path`")
	logLevel := fs.String("log-level", "", "log level")
	diskDir := fs.String("disk-dir", "", "put working copies of writable disks in this `dir` (default: their recorded paths)")
	kvmDev := fs.String("kvm", "", "KVM device `path`")
	paused := fs.Bool("paused", false, "start with the vCPUs paused (resume through the control socket)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return ExitUsage
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "cube-vmm restore: want exactly one snapshot directory (see --help)")
		return ExitUsage
	}
	t0 := time.Now()
	steps := machine.NewSteps(t0)
	snap, err := checkpoint.Open(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "cube-vmm restore: %v\n", err)
		return ExitFailure
	}
	steps.Mark("open")
	man := snap.Manifest
	if man.Components.VMMVersion != Version {
		fmt.Fprintf(stderr, "cube-vmm restore: snapshot was made by %q, this is %q\n", man.Components.VMMVersion, Version)
		return ExitFailure
	}
	cfg := defaults()
	if err := json.Unmarshal(man.Config, &cfg); err != nil {
		fmt.Fprintf(stderr, "cube-vmm restore: snapshot configuration: %v\n", err)
		return ExitFailure
	}
	for f, v := range map[*string]string{&cfg.ControlSocket: *controlPath, &cfg.Vsock: *vsockPath, &cfg.Console: *console,
		&cfg.LogLevel: *logLevel, &cfg.KVMDevice: *kvmDev} {
		if v != "" {
			*f = v
		}
	}
	log := logrus.New()
	log.SetOutput(stderr)
	lvl, err := logrus.ParseLevel(cfg.LogLevel)
	if err != nil {
		fmt.Fprintf(stderr, "cube-vmm restore: log level: %v\n", err)
		return ExitUsage
	}
	log.SetLevel(lvl)
	if len(cfg.Disks) != len(man.Shape.Disks) {
		fmt.Fprintf(stderr, "cube-vmm restore: configuration has %d disks, manifest %d\n", len(cfg.Disks), len(man.Shape.Disks))
		return ExitFailure
	}
	// Working copies: the snapshot's disk copies are never written.
	var made []string
	defer func() {
		// Only on failure: a restored VM keeps its disks.
		for _, p := range made {
			os.Remove(p)
		}
	}()
	// Two writable disks whose files share a name (drives re-pointed by
	// disk-set at files in different directories) would get one working
	// copy in -disk-dir.
	if *diskDir != "" {
		seen := map[string]int{}
		for i, d := range cfg.Disks {
			if man.Shape.Disks[i].ReadOnly {
				continue
			}
			b := filepath.Base(d.Path)
			if j, ok := seen[b]; ok {
				fmt.Fprintf(stderr, "cube-vmm restore: disks %d and %d would both be copied to %s in -disk-dir\n", j, i, b)
				return ExitFailure
			}
			seen[b] = i
		}
	}
	for i := range cfg.Disks {
		d, md := &cfg.Disks[i], man.Shape.Disks[i]
		if md.ReadOnly {
			if fi, err := os.Stat(d.Path); err != nil || fi.Size() != md.Size {
				fmt.Fprintf(stderr, "cube-vmm restore: read-only disk %d (%s) missing or of another size than the snapshot's %d bytes (%v)\n", i, d.Path, md.Size, err)
				return ExitFailure
			}
			continue
		}
		if *diskDir != "" {
			d.Path = filepath.Join(*diskDir, filepath.Base(d.Path))
		}
		if _, err := checkpoint.CloneFile(d.Path, snap.Path(md.File)); err != nil {
			fmt.Fprintf(stderr, "cube-vmm restore: disk %d: %v\n", i, err)
			return ExitFailure
		}
		made = append(made, d.Path)
	}
	steps.Mark("disks")
	mc := machine.Config{KVMDevice: cfg.KVMDevice, Log: logrus.NewEntry(log)}
	switch cfg.Console {
	case "stdout", "":
		mc.Console = stdout
	case "none":
	default:
		f, err := os.OpenFile(cfg.Console, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			fmt.Fprintf(stderr, "cube-vmm restore: console: %v\n", err)
			return ExitUsage
		}
		defer f.Close()
		mc.Console = f
	}
	closeDevices := func() {}
	m, err := machine.Restore(snap, mc, func(m *machine.Machine) error {
		var err error
		closeDevices, err = attachDevices(m, &cfg)
		return err
	})
	defer closeDevices()
	if err != nil {
		fmt.Fprintf(stderr, "cube-vmm restore: %v\n", err)
		return ExitFailure
	}
	defer m.Close()
	made = nil
	steps.Mark("restore")
	comps := man.Components
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	if err := m.StartRestored(*paused); err != nil {
		fmt.Fprintf(stderr, "cube-vmm restore: %v\n", err)
		return ExitFailure
	}
	steps.Mark("start")
	// The control socket appears once the VM runs (or is parked with -paused).
	if cfg.ControlSocket != "" {
		srv, err := control.Listen(cfg.ControlSocket, newTarget(m, cfg, func() (checkpoint.Components, error) { return comps, nil }))
		if err != nil {
			fmt.Fprintf(stderr, "cube-vmm restore: %v\n", err)
			return ExitFailure
		}
		defer func() {
			srv.Close()
			os.Remove(cfg.ControlSocket)
		}()
	}
	steps.Mark("control")
	// took counts from the flags parsed; steps_ms is its breakdown, machine_steps_ms that of restore and start.
	log.WithFields(logrus.Fields{"dir": snap.Dir, "took": time.Since(t0), "steps_ms": steps.String(),
		"machine_steps_ms": m.RestoreSteps()}).Info("restored and running")
	go func() {
		select {
		case s := <-sigs:
			log.WithField("signal", s).Info("stopping")
			m.Stop()
		case <-m.Done():
		}
	}()
	return exitStatus(m.Wait(), stderr)
}

// exitStatus maps how the guest ended to cube-vmm's exit status.
func exitStatus(exit machine.Exit, stderr io.Writer) int {
	switch exit.Reason {
	case machine.ExitPowerOff:
		return ExitPowerOff
	case machine.ExitReboot:
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
