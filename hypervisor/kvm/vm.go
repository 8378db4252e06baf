package kvm

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// VM is a KVM virtual machine file descriptor.
type VM struct {
	fd       int
	sys      *System
	mmapSize int
}

// FD returns the raw descriptor.
func (vm *VM) FD() int { return vm.fd }

// Close closes the VM descriptor. The kernel tears the VM down once every
// vCPU descriptor referring to it is closed as well.
func (vm *VM) Close() error {
	if vm.fd < 0 {
		return nil
	}
	err := unix.Close(vm.fd)
	vm.fd = -1
	return err
}

// CheckExtension asks the VM (rather than the system) about a capability;
// some answers (e.g. memslots) are per VM.
func (vm *VM) CheckExtension(cap int) (int, error) {
	r, err := ioctlArg(vm.fd, kvmCheckExtension, uintptr(cap))
	if err != nil {
		return 0, wrap(fmt.Sprintf("vm KVM_CHECK_EXTENSION %d", cap), err)
	}
	return int(r), nil
}

// SetUserMemoryRegion maps host memory into guest physical space. A zero
// MemorySize deletes the slot.
func (vm *VM) SetUserMemoryRegion(r UserspaceMemoryRegion) error {
	_, err := ioctlPtr(vm.fd, kvmSetUserMemoryRegion, unsafe.Pointer(&r))
	if err != nil {
		return fmt.Errorf("kvm: KVM_SET_USER_MEMORY_REGION slot %d gpa %#x size %#x: %w",
			r.Slot, r.GuestPhysAddr, r.MemorySize, err)
	}
	return nil
}

// SetTSSAddr places the three-page TSS region VMX needs in real mode; it
// must not overlap guest RAM or MMIO.
func (vm *VM) SetTSSAddr(addr uint64) error {
	_, err := ioctlArg(vm.fd, kvmSetTSSAddr, uintptr(addr))
	return wrap("KVM_SET_TSS_ADDR", err)
}

// SetIdentityMapAddr places the one-page EPT identity map (VMX only).
func (vm *VM) SetIdentityMapAddr(addr uint64) error {
	_, err := ioctlPtr(vm.fd, kvmSetIdentityMapAddr, unsafe.Pointer(&addr))
	return wrap("KVM_SET_IDENTITY_MAP_ADDR", err)
}

// CreateIRQChip creates the in-kernel PIC pair, IOAPIC and per-vCPU LAPICs.
// It must be called before any vCPU is created.
func (vm *VM) CreateIRQChip() error {
	_, err := ioctlArg(vm.fd, kvmCreateIRQChip, 0)
	return wrap("KVM_CREATE_IRQCHIP", err)
}

// CreatePIT2 creates the in-kernel i8254 PIT (after CreateIRQChip).
func (vm *VM) CreatePIT2(flags uint32) error {
	c := PITConfig{Flags: flags}
	_, err := ioctlPtr(vm.fd, kvmCreatePIT2, unsafe.Pointer(&c))
	return wrap("KVM_CREATE_PIT2", err)
}

// IRQLine sets the level of an in-kernel irqchip input (GSI).
func (vm *VM) IRQLine(gsi uint32, high bool) error {
	l := IRQLevel{IRQ: gsi}
	if high {
		l.Level = 1
	}
	_, err := ioctlPtr(vm.fd, kvmIRQLine, unsafe.Pointer(&l))
	if err != nil {
		return fmt.Errorf("kvm: KVM_IRQ_LINE gsi %d: %w", gsi, err)
	}
	return nil
}

// SignalMSI injects one MSI.
func (vm *VM) SignalMSI(m MSI) error {
	_, err := ioctlPtr(vm.fd, kvmSignalMSI, unsafe.Pointer(&m))
	return wrap("KVM_SIGNAL_MSI", err)
}

// SetGSIRouting replaces the whole GSI routing table.
func (vm *VM) SetGSIRouting(entries []IRQRoutingEntry) error {
	const max = 4096 // KVM_MAX_IRQ_ROUTES
	if len(entries) > max {
		return fmt.Errorf("kvm: %d routes exceed the limit of %d", len(entries), max)
	}
	hdr := unsafe.Sizeof(irqRoutingHeader{})
	esz := unsafe.Sizeof(IRQRoutingEntry{})
	buf := make([]uint64, (hdr+uintptr(len(entries))*esz)/8)
	h := (*irqRoutingHeader)(unsafe.Pointer(&buf[0]))
	h.NR = uint32(len(entries))
	for i := range entries {
		*(*IRQRoutingEntry)(unsafe.Add(unsafe.Pointer(&buf[0]), hdr+uintptr(i)*esz)) = entries[i]
	}
	_, err := ioctlPtr(vm.fd, kvmSetGSIRouting, unsafe.Pointer(&buf[0]))
	return wrap("KVM_SET_GSI_ROUTING", err)
}

// IRQFD makes a write to eventfd efd raise gsi inside the kernel.
func (vm *VM) IRQFD(efd int, gsi uint32) error {
	f := IRQFD{FD: uint32(efd), GSI: gsi}
	_, err := ioctlPtr(vm.fd, kvmIRQFD, unsafe.Pointer(&f))
	if err != nil {
		return fmt.Errorf("kvm: KVM_IRQFD fd %d gsi %d: %w", efd, gsi, err)
	}
	return nil
}

// IRQFDDetach undoes IRQFD.
func (vm *VM) IRQFDDetach(efd int, gsi uint32) error {
	f := IRQFD{FD: uint32(efd), GSI: gsi, Flags: IRQFDDeassign}
	_, err := ioctlPtr(vm.fd, kvmIRQFD, unsafe.Pointer(&f))
	return wrap("KVM_IRQFD deassign", err)
}

// IOEventFD makes guest writes of length size to addr (PIO if pio) signal
// efd without exiting to userspace. If match is non-nil only writes of that
// value do.
func (vm *VM) IOEventFD(efd int, addr uint64, size uint32, pio bool, match *uint64) error {
	return vm.ioeventfd(efd, addr, size, pio, match, 0)
}

// IOEventFDDetach undoes IOEventFD (same arguments).
func (vm *VM) IOEventFDDetach(efd int, addr uint64, size uint32, pio bool, match *uint64) error {
	return vm.ioeventfd(efd, addr, size, pio, match, IOEventFDDeassign)
}

func (vm *VM) ioeventfd(efd int, addr uint64, size uint32, pio bool, match *uint64, flags uint32) error {
	switch size {
	case 0, 1, 2, 4, 8:
	default:
		return fmt.Errorf("kvm: ioeventfd length %d not in {0,1,2,4,8}", size)
	}
	e := IOEventFD{Addr: addr, Len: size, FD: int32(efd), Flags: flags}
	if pio {
		e.Flags |= IOEventFDPIO
	}
	if match != nil {
		e.Flags |= IOEventFDDataMatch
		e.DataMatch = *match
	}
	_, err := ioctlPtr(vm.fd, kvmIOEventFD, unsafe.Pointer(&e))
	if err != nil {
		return fmt.Errorf("kvm: KVM_IOEVENTFD addr %#x len %d: %w", addr, size, err)
	}
	return nil
}

// GetDirtyLog fetches and clears the dirty bitmap of a slot created with
// MemLogDirtyPages. bitmap needs one bit per 4 KiB page of the slot,
// rounded up to 64 bits; the kernel writes whole longs.
func (vm *VM) GetDirtyLog(slot uint32, bitmap []uint64) error {
	if len(bitmap) == 0 {
		return fmt.Errorf("kvm: KVM_GET_DIRTY_LOG slot %d: empty bitmap", slot)
	}
	d := dirtyLog{Slot: slot, Bitmap: uint64(uintptr(unsafe.Pointer(&bitmap[0])))}
	_, err := ioctlPtr(vm.fd, kvmGetDirtyLog, unsafe.Pointer(&d))
	// The bitmap is referenced through an integer inside d; keep it alive
	// until the kernel is done writing it.
	runtime.KeepAlive(bitmap)
	if err != nil {
		return fmt.Errorf("kvm: KVM_GET_DIRTY_LOG slot %d: %w", slot, err)
	}
	return nil
}

// GetClock reads kvmclock's view of time.
func (vm *VM) GetClock() (ClockData, error) {
	var c ClockData
	_, err := ioctlPtr(vm.fd, kvmGetClock, unsafe.Pointer(&c))
	return c, wrap("KVM_GET_CLOCK", err)
}

// SetClock sets kvmclock.
func (vm *VM) SetClock(c ClockData) error {
	_, err := ioctlPtr(vm.fd, kvmSetClock, unsafe.Pointer(&c))
	return wrap("KVM_SET_CLOCK", err)
}

// GetIRQChip reads one in-kernel chip (IRQChipPICMaster/Slave/IOAPIC).
func (vm *VM) GetIRQChip(id uint32) (IRQChip, error) {
	c := IRQChip{ChipID: id}
	_, err := ioctlPtr(vm.fd, kvmGetIRQChip, unsafe.Pointer(&c))
	if err != nil {
		return c, fmt.Errorf("kvm: KVM_GET_IRQCHIP %d: %w", id, err)
	}
	return c, nil
}

// SetIRQChip writes one in-kernel chip.
func (vm *VM) SetIRQChip(c IRQChip) error {
	_, err := ioctlPtr(vm.fd, kvmSetIRQChip, unsafe.Pointer(&c))
	if err != nil {
		return fmt.Errorf("kvm: KVM_SET_IRQCHIP %d: %w", c.ChipID, err)
	}
	return nil
}

// GetPIT2 reads the in-kernel PIT.
func (vm *VM) GetPIT2() (PITState2, error) {
	var p PITState2
	_, err := ioctlPtr(vm.fd, kvmGetPIT2, unsafe.Pointer(&p))
	return p, wrap("KVM_GET_PIT2", err)
}

// SetPIT2 writes the in-kernel PIT.
func (vm *VM) SetPIT2(p PITState2) error {
	_, err := ioctlPtr(vm.fd, kvmSetPIT2, unsafe.Pointer(&p))
	return wrap("KVM_SET_PIT2", err)
}

// EnableCap enables a VM capability.
func (vm *VM) EnableCap(c EnableCap) error {
	_, err := ioctlPtr(vm.fd, kvmEnableCap, unsafe.Pointer(&c))
	if err != nil {
		return fmt.Errorf("kvm: KVM_ENABLE_CAP %d: %w", c.Cap, err)
	}
	return nil
}

// CreateVCPU creates vCPU id and maps its kvm_run region.
func (vm *VM) CreateVCPU(id int) (*VCPU, error) {
	fd, err := ioctlArg(vm.fd, kvmCreateVCPU, uintptr(id))
	if err != nil {
		return nil, fmt.Errorf("kvm: KVM_CREATE_VCPU %d: %w", id, err)
	}
	unix.CloseOnExec(int(fd))
	run, err := unix.Mmap(int(fd), 0, vm.mmapSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(int(fd))
		return nil, fmt.Errorf("kvm: mmap kvm_run of vcpu %d: %w", id, err)
	}
	return &VCPU{fd: int(fd), id: id, run: run}, nil
}
