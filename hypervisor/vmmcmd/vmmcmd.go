// Package vmmcmd is the cube-vmm command: flags and TOML configuration,
// running one machine, and mapping how the guest ended to an exit status.
package vmmcmd

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/pelletier/go-toml/v2"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/hypervisor/bus"
	"github.com/cube-runtime/cube/hypervisor/control"
	"github.com/cube-runtime/cube/hypervisor/machine"
	"github.com/cube-runtime/cube/hypervisor/virtio/blk"
	"github.com/cube-runtime/cube/hypervisor/virtio/rng"
	"github.com/cube-runtime/cube/hypervisor/virtio/vsock"
)

// Exit statuses of cube-vmm. Documented in docs/vmm.md and --help.
const (
	ExitPowerOff = 0  // the guest powered off
	ExitFailure  = 1  // VMM or KVM failure (message on stderr)
	ExitUsage    = 2  // bad flags or configuration, unreadable kernel/initrd
	ExitReboot   = 10 // the guest rebooted (cube-vmm does not restart it)
	ExitPanic    = 11 // the guest kernel panicked (console tail on stderr)
	ExitStopped  = 12 // stopped by the control socket or SIGINT/SIGTERM
)

// Config is the TOML configuration file; flags override it. A snapshot's
// manifest records it (config) in JSON: its json names are the snapshot
// format's, and changing one is a snapshot.Version bump.
type Config struct {
	Kernel        string `toml:"kernel" json:"Kernel"`                // required
	Initrd        string `toml:"initrd" json:"Initrd"`                // optional
	Cmdline       string `toml:"cmdline" json:"Cmdline"`              // default DefaultCmdline
	MemoryMiB     int    `toml:"memory_mib" json:"MemoryMiB"`         // default 256
	VCPUs         int    `toml:"vcpus" json:"VCPUs"`                  // default 1
	Console       string `toml:"console" json:"Console"`              // "stdout" (default), "none", or a file path
	ConsoleInput  string `toml:"console_input" json:"ConsoleInput"`   // "none" (default) or "stdin"
	ControlSocket string `toml:"control_socket" json:"ControlSocket"` // optional Unix socket path
	KVMDevice     string `toml:"kvm_device" json:"KVMDevice"`         // default /dev/kvm
	HugePages     bool   `toml:"hugepages" json:"HugePages"`          // transparent huge pages for guest RAM (default true)
	Decompress    bool   `toml:"decompress" json:"Decompress"`        // decompress a bzImage on the host (default false)
	KernelCache   string `toml:"kernel_cache" json:"KernelCache"`     // directory caching decompressed kernels (default none)
	LogLevel      string `toml:"log_level" json:"LogLevel"`           // default "warning"
	Disks         []Disk `toml:"disk" json:"Disks"`                   // virtio-blk disks, in PCI slot order (vda, vdb, …)
	Vsock         string `toml:"vsock" json:"Vsock"`                  // hybrid vsock Unix socket path; empty: no vsock device
	VsockCID      uint64 `toml:"vsock_cid" json:"VsockCID"`           // guest CID, default 3
	RNG           bool   `toml:"rng" json:"RNG"`                      // virtio-rng, default on
	Net           []Net  `toml:"net" json:"Net,omitempty"`            // virtio-net devices on taps, after every other device
	// FS are virtio-fs shared directories (after rng, before net).
	// Omitted when empty, so a configuration without them records what
	// it did before.
	FS []Share `toml:"fs" json:"FS,omitempty"`
	// VMGenID adds the VM generation id device (ACPI, not PCI): a new id
	// and a notification on every restore and rollback, which a guest
	// kernel with CONFIG_VMGENID turns into a CRNG reseed. Default off;
	// omitted when off, so a configuration without it records what it
	// did before.
	VMGenID bool `toml:"vmgenid" json:"VMGenID,omitempty"`
	// HugeTLB takes guest RAM from the kernel's 2 MiB hugetlb pool
	// (overrides HugePages). Default off; omitted when off, so a
	// configuration without it records what it did before. A restore
	// ignores it: it maps the snapshot's memory file with small pages.
	HugeTLB bool `toml:"hugetlb" json:"HugeTLB,omitempty"`
}

// Disk is one virtio-blk disk ([[disk]] in the config file).
type Disk struct {
	Path     string `toml:"path" json:"Path"`
	ReadOnly bool   `toml:"read_only" json:"ReadOnly"`
	Serial   string `toml:"serial" json:"Serial"` // GET_ID answer, /sys/block/vdX/serial; at most 20 bytes
}

// parseDisk reads the -disk flag form PATH[,ro][,serial=ID].
func parseDisk(s string) (Disk, error) {
	parts := strings.Split(s, ",")
	d := Disk{Path: parts[0]}
	if d.Path == "" {
		return d, fmt.Errorf("-disk %q: no path (want PATH[,ro][,serial=ID])", s)
	}
	for _, p := range parts[1:] {
		switch {
		case p == "ro":
			d.ReadOnly = true
		case strings.HasPrefix(p, "serial="):
			d.Serial = strings.TrimPrefix(p, "serial=")
		default:
			return d, fmt.Errorf("-disk %q: unknown option %q (want PATH[,ro][,serial=ID])", s, p)
		}
	}
	if len(d.Serial) > 20 {
		return d, fmt.Errorf("-disk %q: serial longer than 20 bytes", s)
	}
	return d, nil
}

// uniqueSerials refuses two disks with one serial: the guest finds disks
// by serial, and disk-set names the disk it re-points by it.
func uniqueSerials(disks []Disk) error {
	seen := map[string]int{}
	for i, d := range disks {
		if d.Serial == "" {
			continue
		}
		if j, ok := seen[d.Serial]; ok {
			return fmt.Errorf("disks %d and %d have the same serial %q", j, i, d.Serial)
		}
		seen[d.Serial] = i
	}
	return nil
}

type diskFlags []Disk

func (d *diskFlags) String() string { return fmt.Sprint(*d) }
func (d *diskFlags) Set(s string) error {
	disk, err := parseDisk(s)
	if err != nil {
		return err
	}
	*d = append(*d, disk)
	return nil
}

// DefaultCmdline suits Debian's cloud kernel on our machine model.
const DefaultCmdline = "console=ttyS0 panic=-1"

func defaults() Config {
	return Config{Cmdline: DefaultCmdline, MemoryMiB: 256, VCPUs: 1, Console: "stdout",
		ConsoleInput: "none", KVMDevice: "/dev/kvm", LogLevel: "warning", HugePages: true, VsockCID: 3, RNG: true}
}

const usageHead = `Usage: cube-vmm [flags]
       cube-vmm restore [flags] SNAPSHOT-DIR   (see cube-vmm restore --help)

Runs one microVM on /dev/kvm: a Linux kernel (bzImage or ELF vmlinux) with an
optional initrd, a 16550 serial console (COM1) and ACPI power management.

Exit status:
  0   the guest powered off
  1   VMM or KVM failure
  2   bad flags or configuration, unreadable kernel or initrd
  10  the guest rebooted (it is not restarted)
  11  the guest kernel panicked (console tail printed on stderr)
  12  stopped through the control socket or by SIGINT/SIGTERM

Flags (override the -config file; its keys are the flag names with '-' as '_',
memory as memory_mib, control as control_socket, kvm as kvm_device):
`

// Run is cube-vmm's main. stdin/stdout/stderr are the process's.
func Run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "restore" {
		return runRestore(args[1:], stdout, stderr)
	}
	cfg, err := parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "cube-vmm: %v\n", err)
		return ExitUsage
	}
	if !cfg.HugePages {
		// Small pages everywhere: guest RSS is not rounded up to 2 MiB.
		// (Nested KVM under TCG boots markedly slower this way.)
		_ = unix.Prctl(unix.PR_SET_THP_DISABLE, 1, 0, 0, 0)
	}
	log := logrus.New()
	log.SetOutput(stderr)
	log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: "15:04:05.000000"})
	lvl, err := logrus.ParseLevel(cfg.LogLevel)
	if err != nil {
		fmt.Fprintf(stderr, "cube-vmm: log level: %v\n", err)
		return ExitUsage
	}
	log.SetLevel(lvl)
	mc, closeConsole, err := machineConfig(&cfg, stdin, stdout, log)
	if err != nil {
		fmt.Fprintf(stderr, "cube-vmm: %v\n", err)
		return ExitUsage
	}
	defer closeConsole()

	m, err := machine.New(mc)
	if err != nil {
		fmt.Fprintf(stderr, "cube-vmm: %v\n", err)
		return ExitFailure
	}
	defer m.Close()
	closeDevices, err := attachDevices(m, &cfg)
	defer closeDevices()
	if err != nil {
		fmt.Fprintf(stderr, "cube-vmm: %v\n", err)
		return ExitFailure
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	if err := m.Start(); err != nil {
		fmt.Fprintf(stderr, "cube-vmm: %v\n", err)
		return ExitFailure
	}
	// The control socket appears only once the VM runs, so a client that
	// can connect can pause it.
	if cfg.ControlSocket != "" {
		srv, err := control.Listen(cfg.ControlSocket, newTarget(m, cfg, components(&cfg)))
		if err != nil {
			fmt.Fprintf(stderr, "cube-vmm: %v\n", err)
			m.Stop()
			return ExitFailure
		}
		defer func() {
			srv.Close()
			os.Remove(cfg.ControlSocket)
		}()
	}
	go func() {
		select {
		case s := <-sigs:
			log.WithField("signal", s).Info("stopping")
			m.Stop()
		case <-m.Done():
		}
	}()
	exit := m.Wait()
	if info := m.Info(); log.IsLevelEnabled(logrus.DebugLevel) {
		log.WithFields(logrus.Fields{"uptime": info.Uptime, "exits_pio": info.ExitsPIO, "exits_mmio": info.ExitsMMIO,
			"exits_interrupted": info.ExitsKick, "pio_by_device": accessSummary(m.PIO().Accesses()),
			"mmio_by_device": accessSummary(m.MMIO().Accesses())}).Debug("vm ended")
	}
	return exitStatus(exit, stderr)
}

// machineConfig is the machine configuration of a boot, with the console
// open (closeConsole closes it). Its errors are the user's (exit 2).
func machineConfig(cfg *Config, stdin io.Reader, stdout io.Writer, log *logrus.Logger) (_ machine.Config, closeConsole func(), _ error) {
	mc := machine.Config{
		KVMDevice: cfg.KVMDevice, Kernel: cfg.Kernel, Initrd: cfg.Initrd, Cmdline: cfg.Cmdline,
		MemoryMiB: cfg.MemoryMiB, VCPUs: cfg.VCPUs, HugePages: cfg.HugePages, HugeTLB: cfg.HugeTLB, Log: logrus.NewEntry(log),
		Decompress: cfg.Decompress, KernelCache: cfg.KernelCache, VMGenID: cfg.VMGenID,
	}
	switch cfg.ConsoleInput {
	case "none", "":
	case "stdin":
		mc.ConsoleInput = stdin
	default:
		return mc, nil, fmt.Errorf("console_input must be none or stdin, not %q", cfg.ConsoleInput)
	}
	if err := mc.Validate(); err != nil {
		return mc, nil, err
	}
	if _, err := os.Stat(cfg.Kernel); err != nil {
		return mc, nil, fmt.Errorf("kernel: %v", err)
	}
	if cfg.Initrd != "" {
		if _, err := os.Stat(cfg.Initrd); err != nil {
			return mc, nil, fmt.Errorf("initrd: %v", err)
		}
	}
	for i, d := range cfg.Disks {
		if _, err := os.Stat(d.Path); err != nil {
			return mc, nil, fmt.Errorf("disk %d: %v", i, err)
		}
	}
	if err := uniqueSerials(cfg.Disks); err != nil {
		return mc, nil, err
	}
	if err := checkNets(cfg.Net); err != nil {
		return mc, nil, err
	}
	if err := checkShares(cfg.FS); err != nil {
		return mc, nil, err
	}
	// Last: nothing to close on the refusals above.
	out, closeConsole, err := openConsole(cfg.Console, stdout)
	if err != nil {
		return mc, nil, err
	}
	mc.Console = out
	return mc, closeConsole, nil
}

// openConsole opens the serial console output named by the console flag
// (boot and restore alike): "stdout" (or empty) is stdout, "none" discards
// it (a nil writer), anything else is a file, appended to. closeConsole
// closes the file.
func openConsole(spec string, stdout io.Writer) (_ io.Writer, closeConsole func(), _ error) {
	switch spec {
	case "stdout", "":
		return stdout, func() {}, nil
	case "none":
		return nil, func() {}, nil
	}
	f, err := os.OpenFile(spec, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("console: %v", err)
	}
	return f, func() { f.Close() }, nil
}

// attachDevices puts the configured virtio devices on the machine's PCI bus. The returned function closes
// what was opened (also after an error).
func attachDevices(m *machine.Machine, cfg *Config) (func(), error) {
	var closers []func() error
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	for i, d := range cfg.Disks {
		dev, err := blk.Open(blk.Options{Path: d.Path, ReadOnly: d.ReadOnly, Serial: d.Serial})
		if err != nil {
			return closeAll, fmt.Errorf("disk %d: %w", i, err)
		}
		closers = append(closers, dev.Close)
		if _, err := m.AddVirtio(dev, 0x01, 0x80); err != nil {
			return closeAll, fmt.Errorf("disk %d: %w", i, err)
		}
	}
	if cfg.Vsock != "" {
		dev, err := vsock.New(vsock.Options{GuestCID: cfg.VsockCID, UDSPath: cfg.Vsock})
		if err != nil {
			return closeAll, err
		}
		closers = append(closers, dev.Close)
		if _, err := m.AddVirtio(dev, 0xff, 0x00); err != nil {
			return closeAll, fmt.Errorf("vsock: %w", err)
		}
	}
	if cfg.RNG {
		if _, err := m.AddVirtio(rng.New(), 0xff, 0x00); err != nil {
			return closeAll, fmt.Errorf("rng: %w", err)
		}
	}
	if err := attachShares(m, cfg.FS, &closers); err != nil {
		return closeAll, err
	}
	// Last: a configuration without net devices keeps its PCI slots.
	if err := attachNets(m, cfg.Net, &closers); err != nil {
		return closeAll, err
	}
	return closeAll, nil
}

// target adapts the machine to the control socket.
type target struct{ m *machine.Machine }

func (t target) Pause() error  { return t.m.Pause() }
func (t target) Resume() error { return t.m.Resume() }
func (t target) Stop()         { t.m.Stop() }
func (t target) InfoJSON() (json.RawMessage, error) {
	return json.Marshal(t.m.Info())
}

// parse merges defaults, the config file and explicitly set flags.
func parse(args []string, stderr io.Writer) (Config, error) {
	cfg := defaults()
	fs := flag.NewFlagSet("cube-vmm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageHead)
		fs.PrintDefaults()
	}
	configPath := fs.String("config", "", "TOML configuration `file`")
	var f Config
	fs.StringVar(&f.Kernel, "kernel", "", "guest kernel `path` (bzImage or ELF vmlinux; required)")
	fs.StringVar(&f.Initrd, "initrd", "", "initramfs `path`")
	fs.StringVar(&f.Cmdline, "cmdline", cfg.Cmdline, "kernel command line")
	fs.IntVar(&f.MemoryMiB, "memory", cfg.MemoryMiB, "guest memory in `MiB` (64..1048576)")
	fs.IntVar(&f.VCPUs, "vcpus", cfg.VCPUs, "number of vCPUs (1..254)")
	fs.StringVar(&f.Console, "console", cfg.Console, "serial console output: stdout, none, or a file `path` (appended)")
	fs.StringVar(&f.ConsoleInput, "console-input", cfg.ConsoleInput, "serial console input: none or stdin")
	fs.StringVar(&f.ControlSocket, "control", "", "control socket `path` (JSON lines: pause, resume, stop, info, snapshot, rollback)")
	fs.StringVar(&f.KVMDevice, "kvm", cfg.KVMDevice, "KVM device `path`")
	fs.BoolVar(&f.HugePages, "hugepages", cfg.HugePages, "back guest memory with 2 MiB-aligned transparent huge pages (=false: THP off for the whole process; -hugetlb takes guest memory over)")
	fs.BoolVar(&f.HugeTLB, "hugetlb", cfg.HugeTLB, "back guest memory with 2 MiB pages from the kernel's hugetlb pool (overrides -hugepages): "+
		"fewer nested page faults than THP can promise, but memory/2 free pages must be in the pool (sysctl vm.nr_hugepages; cube-vmm "+
		"fails naming the shortfall otherwise), reserved for the VM's life, never swapped or shared; memory must be an even number of MiB. "+
		"A restore maps its snapshot with small pages whatever the snapshotted VM had")
	fs.StringVar(&f.LogLevel, "log-level", cfg.LogLevel, "log level: trace, debug, info, warning, error")
	fs.BoolVar(&f.Decompress, "decompress", cfg.Decompress, "decompress a bzImage (LZ4, gzip) on the host and boot its vmlinux directly (no in-guest decompressor, no KASLR)")
	fs.StringVar(&f.KernelCache, "kernel-cache", "", "`directory` keeping decompressed kernels for later boots")
	var disks diskFlags
	fs.Var(&disks, "disk", "virtio-blk disk `PATH[,ro][,serial=ID]` (repeatable; vda, vdb, … in order)")
	fs.StringVar(&f.Vsock, "vsock", "", "virtio-vsock with its host side on this Unix socket `path` (host connects and writes \"CONNECT <port>\\n\"; guest connections to port P go to PATH_P)")
	fs.Uint64Var(&f.VsockCID, "vsock-cid", cfg.VsockCID, "guest vsock CID (>= 3)")
	fs.BoolVar(&f.RNG, "rng", cfg.RNG, "virtio-rng entropy device")
	fs.BoolVar(&f.VMGenID, "vmgenid", cfg.VMGenID, "VM generation id device (ACPI VGEN + GED): a new id and a guest notification on every restore and rollback, so a guest kernel with CONFIG_VMGENID reseeds its RNG")
	var shares shareFlags
	fs.Var(&shares, "fs", "virtio-fs shared directory `tag=TAG,path=DIR[,ro]` (repeatable; the guest mounts it with mount -t virtiofs TAG MOUNTPOINT)")
	var nets netFlags
	fs.Var(&nets, "net", "virtio-net device `tap=NAME|fd=N|none[,mac=XX:XX:XX:XX:XX:XX]` on an existing tap (by name, or an attached tap fd the caller passed), or none: no backend (frames dropped, none received; a restore gives it a tap); no mac: a random locally administered one (repeatable: eth0, eth1, … in order)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q (see --help)", fs.Args())
	}
	if *configPath != "" {
		b, err := os.ReadFile(*configPath)
		if err != nil {
			return cfg, fmt.Errorf("config: %w", err)
		}
		dec := toml.NewDecoder(strings.NewReader(string(b)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg); err != nil {
			var strict *toml.StrictMissingError
			if errors.As(err, &strict) {
				return cfg, fmt.Errorf("config %s: unknown keys:\n%s", *configPath, strict.String())
			}
			return cfg, fmt.Errorf("config %s: %w", *configPath, err)
		}
	}
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "kernel":
			cfg.Kernel = f.Kernel
		case "initrd":
			cfg.Initrd = f.Initrd
		case "cmdline":
			cfg.Cmdline = f.Cmdline
		case "memory":
			cfg.MemoryMiB = f.MemoryMiB
		case "vcpus":
			cfg.VCPUs = f.VCPUs
		case "console":
			cfg.Console = f.Console
		case "console-input":
			cfg.ConsoleInput = f.ConsoleInput
		case "control":
			cfg.ControlSocket = f.ControlSocket
		case "kvm":
			cfg.KVMDevice = f.KVMDevice
		case "hugepages":
			cfg.HugePages = f.HugePages
		case "hugetlb":
			cfg.HugeTLB = f.HugeTLB
		case "log-level":
			cfg.LogLevel = f.LogLevel
		case "decompress":
			cfg.Decompress = f.Decompress
		case "kernel-cache":
			cfg.KernelCache = f.KernelCache
		case "disk":
			cfg.Disks = append(cfg.Disks, disks...)
		case "vsock":
			cfg.Vsock = f.Vsock
		case "vsock-cid":
			cfg.VsockCID = f.VsockCID
		case "rng":
			cfg.RNG = f.RNG
		case "vmgenid":
			cfg.VMGenID = f.VMGenID
		case "net":
			cfg.Net = append(cfg.Net, nets...)
		case "fs":
			cfg.FS = append(cfg.FS, shares...)
		}
	})
	if cfg.Kernel == "" {
		return cfg, errors.New("-kernel is required (see --help)")
	}
	return cfg, nil
}

// accessSummary is "name@base=count ..." for the busiest device ranges of a bus, at most 10.
func accessSummary(a []bus.Access) string {
	var b strings.Builder
	for i, x := range a {
		if i == 10 {
			fmt.Fprintf(&b, " +%d more", len(a)-i)
			break
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s@%#x=%d", strings.ReplaceAll(x.Name, " ", "_"), x.Base, x.Count)
	}
	return b.String()
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// panicExcerpt returns the console from a few lines before the panic
// message to the end, bounded, so the reason is never cut off by a long
// stack trace.
func panicExcerpt(tail string) string {
	lines := strings.Split(strings.TrimRight(tail, "\n"), "\n")
	start := max(len(lines)-40, 0)
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "Kernel panic - not syncing") && !strings.Contains(lines[i], "---[ end") {
			start = max(i-10, 0)
			break
		}
	}
	if len(lines)-start > 120 {
		lines = append(lines[start:start+60:start+60], append([]string{"[...]"}, lines[len(lines)-40:]...)...)
		return strings.Join(lines, "\n")
	}
	return strings.Join(lines[start:], "\n")
}

// DisableHeapTHP re-executes the program with GODEBUG=disablethp=1 when
// the kernel's THP mode is "always": 2 MiB pages under the Go heap would
// multiply the VMM's own RSS, while guest RAM asks for huge pages itself
// (MADV_HUGEPAGE). The setting is read at runtime start, hence the exec.
// On any failure the program simply continues.
func DisableHeapTHP() {
	if strings.Contains(os.Getenv("GODEBUG"), "disablethp=") {
		return
	}
	mode, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil || !strings.Contains(string(mode), "[always]") {
		return
	}
	self, err := os.Executable()
	if err != nil {
		return
	}
	godebug := "disablethp=1"
	if old := os.Getenv("GODEBUG"); old != "" {
		godebug += "," + old
	}
	env := append(os.Environ(), "GODEBUG="+godebug)
	_ = syscall.Exec(self, os.Args, env)
}
