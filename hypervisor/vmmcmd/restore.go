package vmmcmd

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/hypervisor/control"
	"github.com/cube-runtime/cube/hypervisor/machine"
	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

const restoreUsage = `Usage: cube-vmm restore [flags] SNAPSHOT-DIR
       cube-vmm restore -standby -control PATH [flags]

Starts a VM from a snapshot directory written by the control socket's
snapshot op. Guest memory is mapped copy-on-write from the snapshot (the
snapshot never changes); writable disks get working copies (reflinked when
the filesystem can) at their recorded paths, or in -disk-dir, or none with
-disk-use (the caller's file, e.g. an empty drive slot's); -disk-set
re-points a disk before the vCPUs run. The guest's vsock connections are
reset; its agent reconnects.

With -standby, cube-vmm starts without a snapshot: it creates its KVM VM,
listens on -control and waits; the first {"op":"restore","dir":ABS-DIR}
request there restores that snapshot (the process start and the VM
creation are already paid), answers once the VM runs, and from then on the
socket controls that VM as usual. A standby stopped before a restore (stop
op, SIGINT/SIGTERM) exits 12. A restore that fails is answered with the
error and the VMM stays on standby.

Exit statuses as for cube-vmm; a snapshot that cannot be used exits 1.

Flags (default: what the snapshotted VMM had):
`

// restoreFlags are the restore command's overrides of the snapshot's own
// configuration.
type restoreFlags struct {
	control, vsock, console, logLevel, diskDir, kvm string
	nets                                            netFlags
	// diskPaths are working-copy paths by disk serial (-disk-path), over
	// -disk-dir and the recorded paths.
	diskPaths diskPathFlags
	// diskUses are files used as they are, no working copy, by disk serial
	// (-disk-use); diskSets re-point disks before the vCPUs run (-disk-set).
	diskUses, diskSets diskPathFlags
	// fsPaths re-point the snapshot's virtio-fs shares by tag (-fs-path).
	fsPaths fsPathFlags
}

// fsPathFlags is the repeatable -fs-path TAG=DIR.
type fsPathFlags map[string]string

func (d *fsPathFlags) String() string { return fmt.Sprint(map[string]string(*d)) }

func (d *fsPathFlags) Set(v string) error {
	tag, path, ok := strings.Cut(v, "=")
	if !ok || tag == "" || !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return fmt.Errorf("-fs-path %q: want TAG=/absolute/clean/dir", v)
	}
	if *d == nil {
		*d = fsPathFlags{}
	}
	if _, dup := (*d)[tag]; dup {
		return fmt.Errorf("-fs-path: tag %q given twice", tag)
	}
	(*d)[tag] = path
	return nil
}

// diskPathFlags is the repeatable -disk-path SERIAL=PATH.
type diskPathFlags map[string]string

func (d *diskPathFlags) String() string { return fmt.Sprint(map[string]string(*d)) }

func (d *diskPathFlags) Set(v string) error {
	serial, path, ok := strings.Cut(v, "=")
	if !ok || serial == "" || !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return fmt.Errorf("-disk-path %q: want SERIAL=/absolute/clean/path", v)
	}
	if *d == nil {
		*d = diskPathFlags{}
	}
	if _, dup := (*d)[serial]; dup {
		return fmt.Errorf("-disk-path: serial %q given twice", serial)
	}
	(*d)[serial] = path
	return nil
}

// usageError marks a restore error as the caller's (exit 2).
type usageError struct{ error }

// restored is a VM restored from a snapshot, not yet started.
type restored struct {
	m       *machine.Machine
	cfg     Config
	comps   snapshot.Components
	dir     string
	closers []func()
	// copies are the working copies of the writable disks this restore
	// made; the VM keeps them, a failed restore removes them (discard).
	copies []string
	// steps times the restore (steps_ms on the "restored and running" line).
	steps *machine.Steps
}

// close stops and releases the VM and then what it used, in reverse order.
func (r *restored) close() {
	for i := len(r.closers) - 1; i >= 0; i-- {
		r.closers[i]()
	}
	r.closers = nil
}

// discard is close for a restore that failed: the working disk copies go
// too (after the VM and its disks are closed), so nothing it made remains.
func (r *restored) discard() {
	r.close()
	for _, p := range r.copies {
		os.Remove(p)
	}
	r.copies = nil
}

// target is what the control socket controls for the restored VM (its
// snapshots record the restored snapshot's components).
func (r *restored) target() *snapTarget {
	return newTarget(r.m, r.cfg, func() (snapshot.Components, error) { return r.comps, nil })
}

// prepareVM makes a standby's KVM VM on the -kvm device.
func prepareVM(f restoreFlags, log *logrus.Logger) (*machine.PreparedVM, error) {
	return machine.PrepareVM(machine.Config{KVMDevice: f.kvm, Log: logrus.NewEntry(log)})
}

// restoreVM opens the snapshot in dir and restores it (into prepared, if not
// nil; it is consumed either way). Every error but a usageError (the
// caller's flags) names the snapshot; after one nothing restoreVM made
// remains (KVM VM, working disk copies, vsock socket).
func restoreVM(dir string, f restoreFlags, prepared *machine.PreparedVM, stdout io.Writer, log *logrus.Logger) (_ *restored, err error) {
	r := &restored{dir: dir, steps: machine.NewSteps(time.Now())}
	defer func() {
		if err != nil {
			r.discard()
			if prepared != nil {
				prepared.Close()
			}
		}
	}()
	snap, err := snapshot.Open(dir) // its errors name the snapshot
	if err != nil {
		return nil, err
	}
	r.steps.Mark("open")
	cfg, console, err := r.prepare(snap, f, stdout, log)
	if err != nil {
		if errors.As(err, new(usageError)) { // the caller's flags: no snapshot to name
			return nil, err
		}
		return nil, fmt.Errorf("snapshot %s: %w", snap.Dir, err)
	}
	r.steps.Mark("disks")
	mc := machine.Config{KVMDevice: cfg.KVMDevice, Log: logrus.NewEntry(log), Prepared: prepared, Console: console, VMGenID: cfg.VMGenID}
	prepared = nil // Restore owns it now
	m, err := machine.Restore(snap, mc, func(m *machine.Machine) error {
		closeDevices, err := attachDevices(m, &cfg)
		r.closers = append(r.closers, closeDevices)
		return err
	})
	if err != nil { // names the snapshot
		return nil, err
	}
	r.closers = append(r.closers, func() { m.Close() })
	r.m, r.cfg, r.comps = m, cfg, snap.Manifest.Components
	r.steps.Mark("restore")
	return r, nil
}

// prepare does what comes before the machine: the configuration, the log
// level, the console, then the working disk copies.
func (r *restored) prepare(snap *snapshot.Snapshot, f restoreFlags, stdout io.Writer, log *logrus.Logger) (Config, io.Writer, error) {
	cfg, err := restoreConfig(snap, f)
	if err != nil {
		return cfg, nil, err
	}
	lvl, err := logrus.ParseLevel(cfg.LogLevel)
	if err != nil {
		return cfg, nil, usageError{fmt.Errorf("log level: %v", err)}
	}
	if err := restoreNets(cfg.Net, f.nets); err != nil {
		return cfg, nil, usageError{err}
	}
	if err := checkDiskFlags(cfg, func(i int) bool { return snap.Manifest.Shape.Disks[i].ReadOnly }, f); err != nil {
		return cfg, nil, err
	}
	log.SetLevel(lvl)
	// The console before the disk copies: the cheap refusals first.
	console, closeConsole, err := openConsole(cfg.Console, stdout)
	if err != nil {
		return cfg, nil, usageError{err}
	}
	r.closers = append(r.closers, closeConsole)
	if err := r.copyDisks(snap, &cfg, f.diskDir, f.diskPaths, f.diskUses); err != nil {
		return cfg, nil, err
	}
	return cfg, console, nil
}

// restoreConfig is the snapshotted VMM's configuration with the restore's
// flags applied, checked against the snapshot's manifest (the configuration
// is what the devices are rebuilt from, the manifest what the machine is).
func restoreConfig(snap *snapshot.Snapshot, f restoreFlags) (Config, error) {
	man := snap.Manifest
	if v := snapshot.VMMVersion(); man.Components.VMMVersion != v {
		return Config{}, fmt.Errorf("made by %q, this is %q: %w", man.Components.VMMVersion, v, snapshot.ErrMismatch)
	}
	cfg := defaults()
	if err := json.Unmarshal(man.Config, &cfg); err != nil {
		return Config{}, fmt.Errorf("configuration: %v: %w", err, snapshot.ErrCorrupt)
	}
	for p, v := range map[*string]string{&cfg.ControlSocket: f.control, &cfg.Vsock: f.vsock, &cfg.Console: f.console,
		&cfg.LogLevel: f.logLevel, &cfg.KVMDevice: f.kvm} {
		if v != "" {
			*p = v
		}
	}
	for tag, p := range f.fsPaths {
		i := slices.IndexFunc(cfg.FS, func(sh Share) bool { return sh.Tag == tag })
		if i < 0 {
			return Config{}, usageError{fmt.Errorf("-fs-path: the snapshot has no virtio-fs share tagged %q", tag)}
		}
		cfg.FS[i].Path = p
	}
	if s := man.Shape; cfg.MemoryMiB != s.MemoryMiB || cfg.VCPUs != s.VCPUs || len(cfg.Disks) != len(s.Disks) {
		return Config{}, fmt.Errorf("configuration has %d MiB, %d vCPUs, %d disks, manifest %d MiB, %d vCPUs, %d disks: %w",
			cfg.MemoryMiB, cfg.VCPUs, len(cfg.Disks), s.MemoryMiB, s.VCPUs, len(s.Disks), snapshot.ErrCorrupt)
	}
	// Two writable disks whose files share a name (drives re-pointed by
	// disk-set at files in different directories) would get one working
	// copy in -disk-dir.
	if f.diskDir != "" {
		seen := map[string]int{}
		for i, d := range cfg.Disks {
			if man.Shape.Disks[i].ReadOnly {
				continue
			}
			b := filepath.Base(d.Path)
			if j, ok := seen[b]; ok {
				return Config{}, fmt.Errorf("disks %d and %d would both be copied to %s in -disk-dir", j, i, b)
			}
			seen[b] = i
		}
	}
	return cfg, nil
}

// copyDisks makes the working copies of the writable disks (the snapshot's
// own copies are never written) at their recorded paths, or in diskDir, and
// points cfg's disks at them; read-only disks must be where they were; a
// disk in uses gets no copy: its file is the caller's (useDisk).
func (r *restored) copyDisks(snap *snapshot.Snapshot, cfg *Config, diskDir string, paths, uses diskPathFlags) error {
	used := 0
	for i := range cfg.Disks {
		if _, ok := paths[cfg.Disks[i].Serial]; ok && !snap.Manifest.Shape.Disks[i].ReadOnly {
			used++
		}
	}
	if used != len(paths) {
		return usageError{fmt.Errorf("-disk-path names %d serials, the snapshot has %d writable disks with them", len(paths), used)}
	}
	for i := range cfg.Disks {
		d, md := &cfg.Disks[i], snap.Manifest.Shape.Disks[i]
		if md.ReadOnly {
			if fi, err := os.Stat(d.Path); err != nil || fi.Size() != md.Size {
				return fmt.Errorf("read-only disk %d (%s) missing or of another size than the snapshot's %d bytes (%v)", i, d.Path, md.Size, err)
			}
			continue
		}
		if p, ok := uses[d.Serial]; ok {
			if err := useDisk(d, p, md.Size); err != nil {
				return err
			}
			continue
		}
		if p, ok := paths[d.Serial]; ok {
			d.Path = p // replaces what is there (CloneFile renames over it)
		} else if diskDir != "" {
			d.Path = filepath.Join(diskDir, filepath.Base(d.Path))
		}
		if _, err := snapshot.CloneFile(d.Path, snap.Path(md.File)); err != nil {
			return fmt.Errorf("disk %d: %v", i, err)
		}
		r.copies = append(r.copies, d.Path)
	}
	return nil
}

// runRestore is "cube-vmm restore".
func runRestore(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cube-vmm restore", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, restoreUsage)
		fs.PrintDefaults()
	}
	var f restoreFlags
	fs.StringVar(&f.control, "control", "", "control socket `path`")
	fs.StringVar(&f.vsock, "vsock", "", "hybrid vsock Unix socket `path`")
	fs.StringVar(&f.console, "console", "", "serial console output: stdout, none, or a file `path`")
	fs.StringVar(&f.logLevel, "log-level", "", "log level")
	fs.StringVar(&f.diskDir, "disk-dir", "", "put working copies of writable disks in this `dir` (default: their recorded paths)")
	fs.Var(&f.diskPaths, "disk-path", "put the working copy of the writable disk with serial S at `S=PATH` (repeatable; replaces a file there)")
	fs.Var(&f.diskUses, "disk-use", "back the writable disk with serial S with the file `S=PATH` as it is, no working copy (repeatable; as large as the snapshot's disk, whose contents the guest must not depend on: an empty drive slot)")
	fs.Var(&f.diskSets, "disk-set", "re-point the disk with serial S at `S=PATH` before the vCPUs run, as the disk-set op does (repeatable)")
	fs.StringVar(&f.kvm, "kvm", "", "KVM device `path`")
	fs.Var(&f.fsPaths, "fs-path", "share the host directory `TAG=DIR` as the snapshot's virtio-fs share TAG (repeatable; default: the recorded path)")
	fs.Var(&f.nets, "net", "virtio-net device `tap=NAME|fd=N|none` in place of the snapshot's (repeatable, one per device in order; a mac= must be the snapshot's); without it a device the snapshot had with none stays without a backend")
	paused := fs.Bool("paused", false, "start with the vCPUs paused (resume through the control socket)")
	standby := fs.Bool("standby", false, "start without a snapshot and restore the one a restore op on -control names (see above)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return ExitUsage
	}
	log := logrus.New()
	log.SetOutput(stderr)
	if *standby {
		switch {
		case fs.NArg() != 0:
			fmt.Fprintln(stderr, "cube-vmm restore: -standby takes no snapshot directory (the restore op names it; see --help)")
			return ExitUsage
		case f.control == "":
			fmt.Fprintln(stderr, "cube-vmm restore: -standby needs -control PATH (the socket the restore op comes on)")
			return ExitUsage
		case *paused:
			fmt.Fprintln(stderr, `cube-vmm restore: with -standby, ask for a paused VM in the op ({"op":"restore","dir":…,"paused":true})`)
			return ExitUsage
		}
		return runStandby(f, stdout, stderr, log)
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "cube-vmm restore: want exactly one snapshot directory (see --help)")
		return ExitUsage
	}
	t0 := time.Now()
	r, err := restoreVM(fs.Arg(0), f, nil, stdout, log)
	if err != nil {
		fmt.Fprintf(stderr, "cube-vmm restore: %v\n", err)
		if errors.As(err, new(usageError)) {
			return ExitUsage
		}
		return ExitFailure
	}
	defer r.close()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	if err := r.startRestored(*paused, f.diskSets); err != nil {
		r.discard()
		fmt.Fprintf(stderr, "cube-vmm restore: %v\n", err)
		return ExitFailure
	}
	// The control socket appears once the VM runs (or is parked with -paused).
	if r.cfg.ControlSocket != "" {
		srv, err := control.Listen(r.cfg.ControlSocket, r.target())
		if err != nil {
			r.discard() // the restore failed: it keeps nothing
			fmt.Fprintf(stderr, "cube-vmm restore: %v\n", err)
			return ExitFailure
		}
		defer func() {
			srv.Close()
			os.Remove(r.cfg.ControlSocket)
		}()
	}
	r.steps.Mark("control")
	// took counts from the flags parsed; steps_ms is its breakdown, machine_steps_ms that of restore and start.
	log.WithFields(logrus.Fields{"dir": r.dir, "took": time.Since(t0), "steps_ms": r.steps.String(),
		"machine_steps_ms": r.m.RestoreSteps()}).Info("restored and running")
	return waitVM(r.m, sigs, log, stderr)
}

// waitVM runs until the VM ends (a signal stops it) and maps how it ended.
func waitVM(m *machine.Machine, sigs <-chan os.Signal, log *logrus.Logger, stderr io.Writer) int {
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

// standby is the control target of "cube-vmm restore -standby" until its
// restore op succeeds.
type standby struct {
	flags    restoreFlags
	stdout   io.Writer
	log      *logrus.Logger
	srvReady chan struct{} // closed once srv is set
	srv      *control.Server
	stopped  chan struct{} // closed by the stop op
	stopOnce sync.Once
	ready    chan *restored // the restored, running VM

	mu       sync.Mutex // serializes restore ops
	prepared *machine.PreparedVM
	done     bool
}

func (s *standby) Pause() error  { return errors.New("pause: standby, no VM yet (restore first)") }
func (s *standby) Resume() error { return errors.New("resume: standby, no VM yet (restore first)") }
func (s *standby) Stop()         { s.stopOnce.Do(func() { close(s.stopped) }) }
func (s *standby) InfoJSON() (json.RawMessage, error) {
	return json.Marshal(map[string]string{"state": "standby"})
}

// Restore restores dir into the prepared VM, starts it and hands the socket
// over to it; on failure the standby prepares a new VM and keeps waiting.
func (s *standby) Restore(dir string, paused bool) (*control.RestoreResult, error) {
	<-s.srvReady
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return nil, errors.New("restore: already restored")
	}
	select {
	case <-s.stopped:
		return nil, errors.New("restore: the standby VMM is stopping")
	default:
	}
	t0 := time.Now()
	prep := s.prepared
	s.prepared = nil
	if prep == nil {
		var err error
		if prep, err = prepareVM(s.flags, s.log); err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
	}
	r, err := restoreVM(dir, s.flags, prep, s.stdout, s.log) // its errors name the snapshot
	if err == nil {
		if err = r.startRestored(paused, s.flags.diskSets); err != nil {
			r.discard()
			err = fmt.Errorf("restore %s: %w", dir, err)
		}
	}
	if err != nil {
		// prep was consumed; make the next one now, off the next op's path.
		if p, perr := prepareVM(s.flags, s.log); perr == nil {
			s.prepared = p
		} else {
			s.log.WithError(perr).Warn("standby: cannot prepare another VM; the next restore op tries again")
		}
		s.log.WithError(err).WithField("dir", dir).Error("standby: restore failed; still waiting")
		return nil, err
	}
	s.done = true
	s.srv.SetTarget(r.target())
	took := time.Since(t0)
	s.log.WithFields(logrus.Fields{"dir": dir, "took": took, "paused": paused, "steps_ms": r.steps.String(),
		"machine_steps_ms": r.m.RestoreSteps()}).Info("standby: restored and running")
	s.ready <- r
	return &control.RestoreResult{Dir: dir, TookMS: ms(took), Paused: paused}, nil
}

// runStandby is "cube-vmm restore -standby".
func runStandby(f restoreFlags, stdout, stderr io.Writer, log *logrus.Logger) int {
	lvl := f.logLevel
	if lvl == "" {
		lvl = "info"
	}
	l, err := logrus.ParseLevel(lvl)
	if err != nil {
		fmt.Fprintf(stderr, "cube-vmm restore: log level: %v\n", err)
		return ExitUsage
	}
	log.SetLevel(l)
	prep, err := prepareVM(f, log)
	if err != nil {
		fmt.Fprintf(stderr, "cube-vmm restore: standby: %v\n", err)
		return ExitFailure
	}
	s := &standby{flags: f, stdout: stdout, log: log, srvReady: make(chan struct{}), stopped: make(chan struct{}),
		ready: make(chan *restored, 1), prepared: prep}
	defer func() {
		s.mu.Lock()
		if s.prepared != nil {
			s.prepared.Close()
		}
		s.mu.Unlock()
	}()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	srv, err := control.Listen(f.control, s)
	if err != nil {
		fmt.Fprintf(stderr, "cube-vmm restore: %v\n", err)
		return ExitFailure
	}
	defer func() {
		srv.Close()
		os.Remove(f.control)
	}()
	s.srv = srv
	close(s.srvReady)
	log.WithField("control", f.control).Info("standby: VM prepared, waiting for a restore op")
	var r *restored
	select {
	case r = <-s.ready:
	case <-s.stopped:
	case sig := <-sigs:
		log.WithField("signal", sig).Info("standby: stopping")
	}
	if r == nil {
		// A restore op may be running: wait for it, then see what it left.
		s.Stop()
		s.mu.Lock()
		s.mu.Unlock()
		select {
		case r = <-s.ready:
			r.m.Stop()
		default:
			return ExitStopped
		}
	}
	defer r.close()
	return waitVM(r.m, sigs, log, stderr)
}
