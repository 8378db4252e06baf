// Package machine assembles a microVM from the hypervisor's parts: KVM VM
// with in-kernel irqchip and PIT, guest memory, the Linux boot image,
// ACPI tables, legacy devices (serial console, i8042 reset, ACPI power
// management) and vCPU threads. It owns the VM's lifecycle:
// Created → Running ⇄ Paused → Stopped, and reports why the guest ended.
//
// Further devices (PCI, virtio) attach between New and Start through
// Memory, PIO, MMIO and VM.
package machine

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/hypervisor/acpi"
	"github.com/cube-runtime/cube/hypervisor/boot"
	"github.com/cube-runtime/cube/hypervisor/bus"
	"github.com/cube-runtime/cube/hypervisor/devices/i8042"
	"github.com/cube-runtime/cube/hypervisor/devices/pm"
	"github.com/cube-runtime/cube/hypervisor/devices/serial"
	"github.com/cube-runtime/cube/hypervisor/devices/vmgenid"
	"github.com/cube-runtime/cube/hypervisor/kvm"
	"github.com/cube-runtime/cube/hypervisor/memory"
	"github.com/cube-runtime/cube/hypervisor/pci"
	"github.com/cube-runtime/cube/hypervisor/vcpu"
)

// Config describes a VM.
type Config struct {
	KVMDevice string // default /dev/kvm
	Kernel    string // bzImage or ELF vmlinux
	Initrd    string // optional
	Cmdline   string
	MemoryMiB int // default 256
	VCPUs     int // default 1
	HugePages bool
	// HugeTLB takes guest RAM from the 2 MiB hugetlb pool (reserved up
	// front; New fails if the pool is short). It overrides HugePages and
	// needs an even MemoryMiB. A boot's only: a restore maps the
	// snapshot's file.
	HugeTLB bool
	// Console receives the serial console (nil: discarded; the tail is
	// still kept for Exit.ConsoleTail). ConsoleInput, if set, is fed to
	// the guest.
	Console      io.Writer
	ConsoleInput io.Reader
	// Decompress loads a bzImage's LZ4/gzip payload as an ELF vmlinux
	// decompressed on the host, skipping the in-guest decompressor (no
	// KASLR then). KernelCache, if set, is a directory where decompressed
	// kernels are kept (keyed by path, size, mtime and inode) so later
	// boots only map them.
	Decompress  bool
	KernelCache string
	// PanicGrace bounds how long the VMM waits for the rest of a panic
	// trace after "Kernel panic" before ending the VM (default 2s).
	PanicGrace time.Duration
	Log        *logrus.Entry
	// VMGenID adds the VM generation id device (ACPI VGEN and a Generic
	// Event Device on vmgenid.GSI): a random id at boot, a new one and a
	// notification on every restore and rollback. A restore takes it from
	// the snapshot's configuration: it must match the snapshot's state.
	VMGenID bool
	// Prepared, if set, is a KVM VM made ahead of time by PrepareVM (a
	// standby VMM waiting for a snapshot): Restore uses it instead of
	// creating one, and owns it from then on, whatever the outcome.
	Prepared *PreparedVM
}

// Defaults fills zero fields.
func (c *Config) Defaults() {
	if c.KVMDevice == "" {
		c.KVMDevice = kvm.DefaultDevice
	}
	if c.MemoryMiB == 0 {
		c.MemoryMiB = 256
	}
	if c.VCPUs == 0 {
		c.VCPUs = 1
	}
	if c.PanicGrace == 0 {
		c.PanicGrace = 2 * time.Second
	}
	if c.Log == nil {
		c.Log = logrus.NewEntry(logrus.StandardLogger())
	}
}

// Validate checks the configuration without touching KVM.
func (c *Config) Validate() error {
	if c.Kernel == "" {
		return errors.New("no kernel given")
	}
	if c.MemoryMiB < 64 || c.MemoryMiB > 1<<20 {
		return fmt.Errorf("memory %d MiB not in 64..1048576", c.MemoryMiB)
	}
	if c.VCPUs < 1 || c.VCPUs > 254 {
		return fmt.Errorf("%d vCPUs not in 1..254", c.VCPUs)
	}
	if c.HugeTLB && c.MemoryMiB%2 != 0 {
		return fmt.Errorf("memory %d MiB with hugetlb: must be a whole number of 2 MiB pages (an even number of MiB)", c.MemoryMiB)
	}
	return nil
}

// ramBacking names how a boot's guest RAM is backed, for the log.
func ramBacking(c Config) string {
	switch {
	case c.HugeTLB:
		return "hugetlb-2M"
	case c.HugePages:
		return "thp"
	}
	return "4k"
}

// State is the machine's lifecycle state.
type State int

const (
	Created State = iota
	Running
	Paused
	Stopped
)

func (s State) String() string {
	return [...]string{"created", "running", "paused", "stopped"}[s]
}

// ExitReason says why the guest ended.
type ExitReason int

const (
	ExitPowerOff ExitReason = iota // guest powered off (ACPI S5 or KVM shutdown event)
	ExitReboot                     // guest rebooted (ACPI reset, i8042 reset, triple fault)
	ExitPanic                      // guest kernel panicked (seen on the console)
	ExitStopped                    // the host asked us to stop
	ExitError                      // KVM or VMM failure
)

func (r ExitReason) String() string {
	return [...]string{"poweroff", "reboot", "panic", "stopped", "error"}[r]
}

// Exit is the end of a VM.
type Exit struct {
	Reason      ExitReason
	Err         error
	ConsoleTail string
}

// Layout constants.
const (
	tssAddr         = 0xfffbd000 // 3 pages, below the BIOS ROM area
	identityMapAddr = 0xfffbc000
	// PCI windows advertised in the DSDT: 32-bit from the MMIO hole up
	// to the IOAPIC area; 64-bit above RAM, 1 GiB aligned.
	PCIMMIO32Base = memory.MMIOHoleStart
	PCIMMIO32Size = 0xfec00000 - memory.MMIOHoleStart - 64<<20
	PCIMMIO64Size = 64 << 30
)

// Machine is one VM.
type Machine struct {
	cfg  Config
	log  *logrus.Entry
	sys  *kvm.System
	vm   *kvm.VM
	mem  *memory.Memory
	pio  bus.Bus
	mmio bus.Bus

	cpus    vcpu.Set
	serial  *serial.Serial
	console *console
	genid   *vmgenid.Device // nil without Config.VMGenID
	irqfds  []int

	// steps times Restore and StartRestored (nil otherwise); restoreSteps
	// is the result once StartRestored returns (guarded by ctl).
	steps        *Steps
	restoreSteps string

	// ctl serializes Pause/Resume/Stop. mu guards the fields below and is
	// never held while waiting for vCPUs: a vCPU thread may need it (via
	// finish) before it can park.
	ctl sync.Mutex
	// snapMu serializes Snapshot and Rollback with each other and with
	// Close's unmapping of guest memory: a snapshot's pre-copy reads guest
	// memory and depends on the dirty record without holding ctl. Taken
	// before ctl.
	snapMu  sync.Mutex
	mu      sync.Mutex
	state   State
	exit    *Exit
	done    chan struct{}
	started time.Time
	pci64   uint64
	pci     *pci.Bus    // created by the first AddVirtio
	virtio  []virtioDev // in attach order (snapshot.go)
	snap    snapState   // snapshot bookkeeping (snapshot.go)

	unclaimed atomic.Int64
}

// New builds the VM: everything but running it.
func New(cfg Config) (_ *Machine, err error) {
	t0 := time.Now()
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// Kernel and initrd are mapped, not read: they are copied into guest
	// RAM once, and a heap copy would stay in the VMM's RSS.
	kimg, unmapK, err := mapFile(cfg.Kernel)
	if err != nil {
		return nil, fmt.Errorf("read kernel: %w", err)
	}
	defer unmapK()
	kernel, unmapC, err := loadKernel(cfg, kimg)
	if err != nil {
		return nil, fmt.Errorf("kernel %s: %w", cfg.Kernel, err)
	}
	defer unmapC()
	var initrd []byte
	if cfg.Initrd != "" {
		var unmapI func()
		if initrd, unmapI, err = mapFile(cfg.Initrd); err != nil {
			return nil, fmt.Errorf("read initrd: %w", err)
		}
		defer unmapI()
	}

	// Not the named result: every "return nil, err" below would set that
	// to nil before this deferred release runs.
	m := &Machine{cfg: cfg, log: cfg.Log, done: make(chan struct{})}
	defer func() {
		if err != nil {
			m.release()
		}
	}()
	if err = m.createVM(); err != nil {
		return nil, err
	}

	ram := memory.X86Layout(uint64(cfg.MemoryMiB) << 20)
	if m.mem, err = memory.New(ram, memory.Options{HugePages: cfg.HugePages, HugeTLB: cfg.HugeTLB}); err != nil {
		return nil, err
	}
	for i, r := range m.mem.Regions() {
		if err = m.vm.SetUserMemoryRegion(kvm.UserspaceMemoryRegion{
			Slot: uint32(i), GuestPhysAddr: r.GPA, MemorySize: r.Size, UserspaceAddr: r.HostAddr(),
		}); err != nil {
			return nil, err
		}
	}
	last := ram[len(ram)-1].End()
	m.pci64 = (max(last, memory.MMIOHoleEnd) + (1<<30 - 1)) &^ (1<<30 - 1)

	if err = m.addLegacyDevices(); err != nil {
		return nil, err
	}

	loaded, err := m.loadBoot(ram, kernel, initrd)
	if err != nil {
		return nil, err
	}
	if err := m.addBootVCPUs(loaded); err != nil {
		return nil, err
	}
	m.log.WithFields(logrus.Fields{"memory_mib": cfg.MemoryMiB, "ram": ramBacking(cfg), "vcpus": cfg.VCPUs, "entry": fmt.Sprintf("%#x", loaded.Entry),
		"initrd": fmt.Sprintf("%#x+%d", loaded.InitrdAddr, len(initrd)), "took": time.Since(t0).String()}).Debug("machine built")
	return m, nil
}

// addLegacyDevices wires the serial console (COM1 on IRQ 4), the i8042
// reset, the ACPI power-management ports and, if configured, the VM
// generation id (guest memory must be there).
func (m *Machine) addLegacyDevices() error {
	if m.cfg.VMGenID {
		var err error
		if m.genid, err = vmgenid.New(vmgenid.Options{Mem: m.mem, Addr: boot.VMGenIDAddr, GSI: vmgenid.GSI, Raise: m.pulseGSI}); err != nil {
			return err
		}
	}
	m.console = &console{out: m.cfg.Console, onPanic: m.guestPanicked}
	// The UART's interrupt is a synchronous edge on the irqchip input
	// (KVM_IRQ_LINE high then low) from the vCPU thread that caused it.
	// An irqfd would inject from a kernel work item instead, and a guest
	// that writes to its console and powers off at once could outrun it.
	m.serial = serial.New(m.console, func() {
		if err := m.vm.IRQLine(serial.COM1IRQ, true); err != nil {
			m.log.WithError(err).Warn("serial interrupt")
			return
		}
		m.vm.IRQLine(serial.COM1IRQ, false)
	})
	if err := m.pio.Register(serial.COM1Base, serial.Size, "serial COM1", m.serial); err != nil {
		return err
	}
	kbd := &i8042.Device{OnReset: func() { m.finish(ExitReboot, errI8042Reset) }}
	if err := m.pio.Register(i8042.Base, i8042.Size, "i8042", kbd); err != nil {
		return err
	}
	power := &pm.Device{
		OnPowerOff: func() { m.finish(ExitPowerOff, nil) },
		OnReset:    func() { m.finish(ExitReboot, errACPIReset) },
	}
	return m.pio.Register(pm.Base, pm.Size, "acpi pm", power)
}

// pulseGSI raises an edge on an irqchip input: high, then low.
func (m *Machine) pulseGSI(gsi uint32) error {
	if err := m.vm.IRQLine(gsi, true); err != nil {
		return err
	}
	return m.vm.IRQLine(gsi, false)
}

// logUnclaimed traces accesses no device took (first 5000 only).
func (m *Machine) logUnclaimed(pio, write bool, addr uint64, data []byte) {
	if m.unclaimed.Add(1) > 5000 {
		return
	}
	space := "mmio"
	if pio {
		space = "pio"
	}
	m.log.WithFields(logrus.Fields{"space": space, "write": write, "addr": fmt.Sprintf("%#x", addr),
		"data": fmt.Sprintf("% x", data)}).Trace("unclaimed access")
}

// Accessors for attaching devices between New and Start.

// Memory is guest RAM.
func (m *Machine) Memory() *memory.Memory { return m.mem }

// PIO is the port I/O bus.
func (m *Machine) PIO() *bus.Bus { return &m.pio }

// MMIO is the MMIO bus (accesses outside RAM that no ioeventfd took).
func (m *Machine) MMIO() *bus.Bus { return &m.mmio }

// VM is the KVM VM, for irqfd, ioeventfd, GSI routing and MSI injection.
func (m *Machine) VM() *kvm.VM { return m.vm }

// PCIWindows returns the PCI host bridge windows advertised to the guest.
func (m *Machine) PCIWindows() acpi.PCIWindows {
	return acpi.PCIWindows{MMIO32Base: PCIMMIO32Base, MMIO32Size: PCIMMIO32Size, MMIO64Base: m.pci64, MMIO64Size: PCIMMIO64Size}
}

// Start runs the vCPUs.
func (m *Machine) Start() error {
	m.mu.Lock()
	if m.state != Created {
		m.mu.Unlock()
		return fmt.Errorf("start: machine is %v", m.state)
	}
	m.state = Running
	m.started = time.Now()
	m.mu.Unlock()
	m.log.Debug("starting vcpus")
	for _, c := range m.cpus {
		c.Start(m.vcpuExited)
	}
	if in := m.cfg.ConsoleInput; in != nil {
		go func() {
			buf := make([]byte, 256)
			for {
				n, err := in.Read(buf)
				if n > 0 {
					m.serial.Enqueue(buf[:n])
				}
				if err != nil {
					return
				}
			}
		}()
	}
	return nil
}

// vcpuExited maps a vCPU's end to the machine's end.
func (m *Machine) vcpuExited(r vcpu.Result) {
	switch r.Reason {
	case vcpu.ReasonStopped:
		return // we asked for it
	case vcpu.ReasonShutdown:
		m.finish(ExitPowerOff, nil)
	case vcpu.ReasonReset:
		err := r.Err
		if err == nil {
			err = errSystemReset
		}
		m.finish(ExitReboot, fmt.Errorf("vcpu %d: %w", r.ID, err))
	case vcpu.ReasonCrash:
		m.finish(ExitPanic, r.Err)
	case vcpu.ReasonHalted:
		m.finish(ExitError, fmt.Errorf("vcpu %d: unexpected HLT exit", r.ID))
	default:
		m.finish(ExitError, fmt.Errorf("vcpu %d: %w", r.ID, r.Err))
	}
}

// How the guest asked for a reset (Exit.Err of an ExitReboot; a triple
// fault is the vCPU's own error).
var (
	errI8042Reset  = errors.New("reset through the i8042 controller (port 0x64 command 0xfe)")
	errACPIReset   = errors.New("reset through the ACPI reset register")
	errSystemReset = errors.New("reset system event from KVM")
)

// guestPanicked is the console's panic callback.
func (m *Machine) guestPanicked(done bool) {
	if done {
		m.finish(ExitPanic, nil)
		return
	}
	m.log.Warn("guest kernel panic")
	time.AfterFunc(m.cfg.PanicGrace, func() { m.finish(ExitPanic, nil) })
}

// finish records the first end reason and stops the vCPUs. It may be
// called from a vCPU thread, so the stop happens on another goroutine
// (Set.Stop waits for every vCPU thread, including the caller's).
func (m *Machine) finish(reason ExitReason, err error) {
	m.mu.Lock()
	if m.exit != nil {
		m.mu.Unlock()
		return
	}
	// A panicking kernel reboots (panic=N) or resets: report the panic.
	if (reason == ExitReboot || reason == ExitPowerOff) && m.console != nil && m.console.Panicked() {
		reason, err = ExitPanic, nil
	}
	m.exit = &Exit{Reason: reason, Err: err}
	m.mu.Unlock()
	m.log.WithField("reason", reason).WithError(err).Debug("guest ended")
	go func() {
		m.cpus.Stop()
		if m.log.Logger.IsLevelEnabled(logrus.DebugLevel) {
			// Where each vCPU was: the first clue when a guest hangs.
			for _, c := range m.cpus {
				regs, _ := c.CPU.GetRegs()
				mp, _ := c.CPU.GetMPState()
				m.log.WithFields(logrus.Fields{"vcpu": c.CPU.ID(), "rip": fmt.Sprintf("%#x", regs.RIP),
					"rflags": fmt.Sprintf("%#x", regs.RFLAGS), "mp_state": mp.MPState}).Debug("vcpu stopped")
			}
		}
		m.mu.Lock()
		m.state = Stopped
		m.exit.ConsoleTail = m.console.Tail()
		m.mu.Unlock()
		close(m.done)
	}()
}

// Pause parks all vCPUs (guest time stops advancing only for code; the
// kvmclock keeps running unless the caller saves and restores it).
func (m *Machine) Pause() error {
	m.ctl.Lock()
	defer m.ctl.Unlock()
	switch st := m.State(); st {
	case Paused:
		return nil
	case Running:
	default:
		return fmt.Errorf("pause: machine is %v", st)
	}
	m.cpus.Pause()
	m.mu.Lock()
	if m.state == Running {
		m.state = Paused
	}
	m.mu.Unlock()
	return nil
}

// Resume restarts paused vCPUs. The guest's kvmclock is told it was
// paused so its watchdogs do not fire.
func (m *Machine) Resume() error {
	m.ctl.Lock()
	defer m.ctl.Unlock()
	switch st := m.State(); st {
	case Running:
		return nil
	case Paused:
	default:
		return fmt.Errorf("resume: machine is %v", st)
	}
	for _, c := range m.cpus {
		// EINVAL until the guest enables kvmclock: nothing to tell then.
		_ = c.CPU.KVMClockCtrl()
	}
	m.mu.Lock()
	if m.state == Paused {
		m.state = Running
	}
	m.mu.Unlock()
	m.cpus.Resume()
	return nil
}

// Stop ends the VM from the host side.
func (m *Machine) Stop() {
	m.ctl.Lock()
	defer m.ctl.Unlock()
	m.mu.Lock()
	if m.state == Created {
		m.state = Stopped
		m.exit = &Exit{Reason: ExitStopped}
		m.mu.Unlock()
		close(m.done)
		return
	}
	m.mu.Unlock()
	m.finish(ExitStopped, nil)
	<-m.done
}

// Done is closed when the VM has ended.
func (m *Machine) Done() <-chan struct{} { return m.done }

// Wait blocks until the VM ends and returns why.
func (m *Machine) Wait() Exit {
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	return *m.exit
}

// Info is a snapshot of the machine's status.
type Info struct {
	State     string   `json:"state"`
	VCPUs     int      `json:"vcpus"`
	MemoryMiB int      `json:"memory_mib"`
	Uptime    string   `json:"uptime,omitempty"`
	Exit      string   `json:"exit,omitempty"`
	PIO       []string `json:"pio"`
	MMIO      []string `json:"mmio"`
	// Exits to userspace, summed over vCPUs.
	ExitsPIO  uint64 `json:"exits_pio"`
	ExitsMMIO uint64 `json:"exits_mmio"`
	ExitsKick uint64 `json:"exits_interrupted"`
}

// Info reports the machine's status.
func (m *Machine) Info() Info {
	m.mu.Lock()
	defer m.mu.Unlock()
	i := Info{State: m.state.String(), VCPUs: m.cfg.VCPUs, MemoryMiB: m.cfg.MemoryMiB, PIO: m.pio.Ranges(), MMIO: m.mmio.Ranges()}
	if !m.started.IsZero() {
		i.Uptime = time.Since(m.started).Round(time.Millisecond).String()
	}
	if m.exit != nil {
		i.Exit = m.exit.Reason.String()
	}
	for _, c := range m.cpus {
		i.ExitsPIO += c.Exits.PIO.Load()
		i.ExitsMMIO += c.Exits.MMIO.Load()
		i.ExitsKick += c.Exits.Interrupted.Load()
	}
	return i
}

// State reports the lifecycle state.
func (m *Machine) State() State {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state
}

// Close releases KVM, memory and descriptors. Call after the VM ended.
func (m *Machine) Close() error {
	m.mu.Lock()
	st := m.state
	m.mu.Unlock()
	if st == Running || st == Paused {
		m.Stop()
	}
	// A snapshot's pre-copy may still be reading guest memory (it then
	// fails at its freeze: the machine is stopped).
	m.snapMu.Lock()
	defer m.snapMu.Unlock()
	m.release()
	return nil
}

func (m *Machine) release() {
	// Virtio transports first: once reset, no device touches guest memory
	// (virtio-net's receive and vsock's host side run on goroutines of
	// their own, and their owner may close them after the machine).
	for _, v := range m.virtio {
		v.tr.Reset()
	}
	for _, c := range m.cpus {
		c.CPU.Close()
	}
	m.cpus = nil
	for _, fd := range m.irqfds {
		unix.Close(fd)
	}
	m.irqfds = nil
	if m.vm != nil {
		m.vm.Close()
		m.vm = nil
	}
	if m.mem != nil {
		m.mem.Close()
		m.mem = nil
	}
	if m.sys != nil {
		m.sys.Close()
		m.sys = nil
	}
}
