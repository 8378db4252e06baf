package kvmtest

import (
	"errors"
	"fmt"
	"io/fs"

	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/hypervisor/kvm"
)

// Guest is a one-vCPU VM in 64-bit mode running hand-assembled code at
// CodeAddr, with 2 MiB of RAM and the first 1 GiB identity-mapped. Everything
// between 0x10000 and MemSize is free for the test's data.
type Guest struct {
	Sys *kvm.System
	VM  *kvm.VM
	Mem []byte
	CPU *kvm.VCPU
}

// Guest-physical layout.
const (
	MemSize  = 2 << 20
	gdtAddr  = 0x500
	pml4Addr = 0x1000
	pdptAddr = 0x2000
	pdAddr   = 0x3000
	CodeAddr = 0x4000
	StackTop = 0x7000
	// DataAddr is a free page for the guest's data.
	DataAddr = 0x8000
)

// GuestOptions tune NewGuest.
type GuestOptions struct {
	IRQChip  bool // create the in-kernel irqchip and PIT before the vCPU
	DirtyLog bool // log dirty pages on the RAM slot (slot 0)
}

// NewGuest opens devPath and builds a Guest running code. A missing device
// is reported as ErrNoKVM.
func NewGuest(devPath string, code []byte, opt GuestOptions) (g *Guest, err error) {
	if len(code) > StackTop-CodeAddr-0x100 {
		return nil, fmt.Errorf("guest code of %d bytes does not fit", len(code))
	}
	sys, err := kvm.Open(devPath)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s: %w: %w", devPath, ErrNoKVM, err)
		}
		return nil, err
	}
	g = &Guest{Sys: sys}
	defer func() {
		if err != nil {
			g.Close()
		}
	}()
	if g.VM, err = sys.CreateVM(); err != nil {
		return nil, err
	}
	if opt.IRQChip {
		if err = g.VM.CreateIRQChip(); err != nil {
			return nil, err
		}
		if err = g.VM.CreatePIT2(kvm.PITSpeakerDummy); err != nil {
			return nil, err
		}
	}
	g.Mem, err = unix.Mmap(-1, 0, MemSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("mmap guest memory: %w", err)
	}
	writePageTables(g.Mem)
	copy(g.Mem[CodeAddr:], code)
	var flags uint32
	if opt.DirtyLog {
		flags = kvm.MemLogDirtyPages
	}
	if err = g.VM.SetUserMemoryRegion(kvm.UserspaceMemoryRegion{
		Slot: 0, Flags: flags, MemorySize: MemSize, UserspaceAddr: sliceAddr(g.Mem),
	}); err != nil {
		return nil, err
	}
	if g.CPU, err = g.VM.CreateVCPU(0); err != nil {
		return nil, err
	}
	if err = LongMode(g.CPU, pml4Addr, gdtAddr); err != nil {
		return nil, err
	}
	if err = g.CPU.SetRegs(kvm.Regs{RIP: CodeAddr, RSP: StackTop, RFLAGS: 2}); err != nil {
		return nil, err
	}
	return g, nil
}

// Close releases everything NewGuest made.
func (g *Guest) Close() {
	if g.CPU != nil {
		g.CPU.Close()
	}
	if g.VM != nil {
		g.VM.Close()
	}
	if g.Mem != nil {
		unix.Munmap(g.Mem)
	}
	if g.Sys != nil {
		g.Sys.Close()
	}
}

func writePageTables(mem []byte) {
	const (
		present = 1 << 0
		rw      = 1 << 1
		ps      = 1 << 7
	)
	// Identity-map the first 1 GiB with 2 MiB pages: RAM is the first
	// page, the rest is unbacked and so reaches the VMM as MMIO exits.
	le.PutUint64(mem[pml4Addr:], pdptAddr|present|rw)
	le.PutUint64(mem[pdptAddr:], pdAddr|present|rw)
	for i := uint64(0); i < 512; i++ {
		le.PutUint64(mem[pdAddr+8*i:], i<<21|present|rw|ps)
	}
	WriteGDT(mem[gdtAddr:])
}
