package kvm

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// VCPU is a KVM vCPU descriptor plus its mapped kvm_run region.
//
// KVM requires every vCPU ioctl that touches run state (KVM_RUN above all)
// to come from one thread at a time; callers run a vCPU from a goroutine
// locked to its OS thread (see the vcpu package).
type VCPU struct {
	fd  int
	id  int
	run []byte
}

// ErrInterrupted is returned by Run when KVM_RUN returned EINTR, i.e. the
// vCPU was kicked (signal or immediate_exit) and no exit data is valid.
var ErrInterrupted = errors.New("kvm: KVM_RUN interrupted")

// ID is the vCPU index given at creation (also its APIC id).
func (c *VCPU) ID() int { return c.id }

// FD returns the raw descriptor.
func (c *VCPU) FD() int { return c.fd }

// Close unmaps kvm_run and closes the descriptor.
func (c *VCPU) Close() error {
	if c.fd < 0 {
		return nil
	}
	var errs []error
	if c.run != nil {
		errs = append(errs, unix.Munmap(c.run))
		c.run = nil
	}
	errs = append(errs, unix.Close(c.fd))
	c.fd = -1
	return errors.Join(errs...)
}

// Run enters the guest until the next exit. On EINTR it returns
// ErrInterrupted (the caller decides whether to re-enter); any other error
// is fatal for the vCPU.
func (c *VCPU) Run() error {
	if c.fd < 0 {
		return ErrClosed
	}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(c.fd), kvmRun, 0)
	switch e {
	case 0:
		return nil
	case unix.EINTR, unix.EAGAIN:
		return ErrInterrupted
	default:
		return fmt.Errorf("kvm: KVM_RUN vcpu %d: %w", c.id, e)
	}
}

// SetImmediateExit sets kvm_run.immediate_exit: while set, KVM_RUN returns
// EINTR at once instead of entering the guest. A kicker sets it and then
// signals the vCPU thread, which closes the race where the signal lands
// just before the thread enters KVM_RUN.
func (c *VCPU) SetImmediateExit(on bool) {
	var v byte
	if on {
		v = 1
	}
	c.run[runImmediateExit] = v
}

// ImmediateExit reports kvm_run.immediate_exit.
func (c *VCPU) ImmediateExit() bool { return c.run[runImmediateExit] != 0 }

// RunData returns the vCPU's kvm_run region for exit decoding.
func (c *VCPU) RunData() RunData { return RunData(c.run) }

func (c *VCPU) get(req uintptr, p unsafe.Pointer, op string) error {
	if c.fd < 0 {
		return ErrClosed
	}
	if _, err := ioctlPtr(c.fd, req, p); err != nil {
		return fmt.Errorf("kvm: vcpu %d: %s: %w", c.id, op, err)
	}
	return nil
}

// GetRegs reads the general-purpose registers.
func (c *VCPU) GetRegs() (Regs, error) {
	var r Regs
	return r, c.get(kvmGetRegs, unsafe.Pointer(&r), "KVM_GET_REGS")
}

// SetRegs writes the general-purpose registers.
func (c *VCPU) SetRegs(r Regs) error {
	return c.get(kvmSetRegs, unsafe.Pointer(&r), "KVM_SET_REGS")
}

// GetSregs reads the special registers.
func (c *VCPU) GetSregs() (Sregs, error) {
	var s Sregs
	return s, c.get(kvmGetSregs, unsafe.Pointer(&s), "KVM_GET_SREGS")
}

// SetSregs writes the special registers.
func (c *VCPU) SetSregs(s Sregs) error {
	return c.get(kvmSetSregs, unsafe.Pointer(&s), "KVM_SET_SREGS")
}

// GetFPU reads the legacy FPU/SSE state.
func (c *VCPU) GetFPU() (FPU, error) {
	var f FPU
	return f, c.get(kvmGetFPU, unsafe.Pointer(&f), "KVM_GET_FPU")
}

// SetFPU writes the legacy FPU/SSE state.
func (c *VCPU) SetFPU(f FPU) error {
	return c.get(kvmSetFPU, unsafe.Pointer(&f), "KVM_SET_FPU")
}

// GetXSave reads the 4 KiB XSAVE area.
func (c *VCPU) GetXSave() (*XSave, error) {
	x := new(XSave)
	return x, c.get(kvmGetXSave, unsafe.Pointer(x), "KVM_GET_XSAVE")
}

// SetXSave writes an XSAVE area of at least 4 KiB (KVM_SET_XSAVE reads as
// many bytes as KVM_CAP_XSAVE2 reports, so buf must be that long).
func (c *VCPU) SetXSave(buf []uint32) error {
	if len(buf) < len(XSave{}.Region) {
		return fmt.Errorf("kvm: vcpu %d: xsave buffer of %d words is shorter than 1024", c.id, len(buf))
	}
	return c.get(kvmSetXSave, unsafe.Pointer(&buf[0]), "KVM_SET_XSAVE")
}

// GetXSave2 reads an XSAVE area of size bytes, the value of
// CheckExtension(CapXSave2) (at least 4096).
func (c *VCPU) GetXSave2(size int) ([]uint32, error) {
	if size < 4096 || size > 1<<20 {
		return nil, fmt.Errorf("kvm: vcpu %d: xsave2 size %d out of range", c.id, size)
	}
	buf := make([]uint32, (size+3)/4)
	return buf, c.get(kvmGetXSave2, unsafe.Pointer(&buf[0]), "KVM_GET_XSAVE2")
}

// GetXCRs reads the extended control registers.
func (c *VCPU) GetXCRs() (XCRs, error) {
	var x XCRs
	return x, c.get(kvmGetXCRs, unsafe.Pointer(&x), "KVM_GET_XCRS")
}

// SetXCRs writes the extended control registers.
func (c *VCPU) SetXCRs(x XCRs) error {
	if x.NrXCRs > MaxXCRs {
		return fmt.Errorf("kvm: vcpu %d: %d xcrs exceed %d", c.id, x.NrXCRs, MaxXCRs)
	}
	return c.get(kvmSetXCRs, unsafe.Pointer(&x), "KVM_SET_XCRS")
}

// GetLAPIC reads the in-kernel local APIC page.
func (c *VCPU) GetLAPIC() (LAPICState, error) {
	var l LAPICState
	return l, c.get(kvmGetLAPIC, unsafe.Pointer(&l), "KVM_GET_LAPIC")
}

// SetLAPIC writes the in-kernel local APIC page.
func (c *VCPU) SetLAPIC(l LAPICState) error {
	return c.get(kvmSetLAPIC, unsafe.Pointer(&l), "KVM_SET_LAPIC")
}

// GetMPState reads the multiprocessing state.
func (c *VCPU) GetMPState() (MPState, error) {
	var m MPState
	return m, c.get(kvmGetMPState, unsafe.Pointer(&m), "KVM_GET_MP_STATE")
}

// SetMPState writes the multiprocessing state.
func (c *VCPU) SetMPState(m MPState) error {
	return c.get(kvmSetMPState, unsafe.Pointer(&m), "KVM_SET_MP_STATE")
}

// GetVCPUEvents reads pending exceptions/interrupts/NMI/SMI.
func (c *VCPU) GetVCPUEvents() (VCPUEvents, error) {
	var e VCPUEvents
	return e, c.get(kvmGetVCPUEvents, unsafe.Pointer(&e), "KVM_GET_VCPU_EVENTS")
}

// SetVCPUEvents writes pending events.
func (c *VCPU) SetVCPUEvents(e VCPUEvents) error {
	return c.get(kvmSetVCPUEvents, unsafe.Pointer(&e), "KVM_SET_VCPU_EVENTS")
}

// GetDebugRegs reads DR0-3, DR6, DR7.
func (c *VCPU) GetDebugRegs() (DebugRegs, error) {
	var d DebugRegs
	return d, c.get(kvmGetDebugRegs, unsafe.Pointer(&d), "KVM_GET_DEBUGREGS")
}

// SetDebugRegs writes the debug registers.
func (c *VCPU) SetDebugRegs(d DebugRegs) error {
	return c.get(kvmSetDebugRegs, unsafe.Pointer(&d), "KVM_SET_DEBUGREGS")
}

// GetMSRs reads the MSRs named by indices.
func (c *VCPU) GetMSRs(indices []uint32) ([]MSREntry, error) {
	in := make([]MSREntry, len(indices))
	for i, idx := range indices {
		in[i].Index = idx
	}
	n, err := c.msrs(kvmGetMSRs, in, "KVM_GET_MSRS")
	if err != nil {
		return nil, err
	}
	if n != len(in) {
		// KVM stops at the first MSR it cannot read; say which.
		return nil, fmt.Errorf("kvm: vcpu %d: KVM_GET_MSRS read %d of %d (stopped at %#x)", c.id, n, len(in), in[n].Index)
	}
	return in, nil
}

// SetMSRs writes MSRs; all must be accepted.
func (c *VCPU) SetMSRs(entries []MSREntry) error {
	in := append([]MSREntry(nil), entries...)
	n, err := c.msrs(kvmSetMSRs, in, "KVM_SET_MSRS")
	if err != nil {
		return err
	}
	if n != len(in) {
		return fmt.Errorf("kvm: vcpu %d: KVM_SET_MSRS wrote %d of %d (stopped at %#x)", c.id, n, len(in), in[n].Index)
	}
	return nil
}

// msrs marshals entries into a struct kvm_msrs buffer, runs req and copies
// the entries back; it returns how many entries the kernel processed.
func (c *VCPU) msrs(req uintptr, entries []MSREntry, op string) (int, error) {
	const max = 1 << 12
	if len(entries) > max {
		return 0, fmt.Errorf("kvm: vcpu %d: %s: %d msrs exceed %d", c.id, op, len(entries), max)
	}
	// Header (8 bytes) + 16-byte entries, as uint64 words for alignment.
	buf := make([]uint64, 1+2*len(entries))
	(*msrsHeader)(unsafe.Pointer(&buf[0])).NMSRs = uint32(len(entries))
	for i := range entries {
		*(*MSREntry)(unsafe.Pointer(&buf[1+2*i])) = entries[i]
	}
	if c.fd < 0 {
		return 0, ErrClosed
	}
	r, err := ioctlPtr(c.fd, req, unsafe.Pointer(&buf[0]))
	if err != nil {
		return 0, fmt.Errorf("kvm: vcpu %d: %s: %w", c.id, op, err)
	}
	n := int(r)
	if n < 0 || n > len(entries) {
		return 0, fmt.Errorf("kvm: vcpu %d: %s returned %d for %d entries", c.id, op, n, len(entries))
	}
	for i := range entries {
		entries[i] = *(*MSREntry)(unsafe.Pointer(&buf[1+2*i]))
	}
	return n, nil
}

// SetCPUID2 sets the guest's CPUID table.
func (c *VCPU) SetCPUID2(entries []CPUIDEntry2) error {
	buf, err := cpuid2Buffer(entries)
	if err != nil {
		return err
	}
	return c.get(kvmSetCPUID2, unsafe.Pointer(&buf[0]), "KVM_SET_CPUID2")
}

// GetCPUID2 reads the guest's CPUID table.
func (c *VCPU) GetCPUID2() ([]CPUIDEntry2, error) {
	buf := newCPUID2(MaxCPUIDEntries)
	if err := c.get(kvmGetCPUID2, unsafe.Pointer(&buf[0]), "KVM_GET_CPUID2"); err != nil {
		return nil, err
	}
	e, err := cpuid2Entries(buf)
	return TrimCPUID2(e), err
}

// TrimCPUID2 drops the all-zero entries at the end of a KVM_GET_CPUID2
// answer. Linux before 6.2 or so sets nent only when the buffer is too small:
// on success it leaves the caller's count (the whole buffer) and copies
// fewer entries, so the rest is the zeroed buffer. No real entry is all zero
// (leaf 0 holds the highest leaf and the vendor).
func TrimCPUID2(e []CPUIDEntry2) []CPUIDEntry2 {
	for len(e) > 0 && e[len(e)-1] == (CPUIDEntry2{}) {
		e = e[:len(e)-1]
	}
	return e
}

// GetTSCKHz reads the vCPU's TSC frequency.
func (c *VCPU) GetTSCKHz() (uint32, error) {
	r, err := ioctlArg(c.fd, kvmGetTSCKHz, 0)
	if err != nil {
		return 0, fmt.Errorf("kvm: vcpu %d: KVM_GET_TSC_KHZ: %w", c.id, err)
	}
	return uint32(r), nil
}

// SetTSCKHz sets the vCPU's TSC frequency.
func (c *VCPU) SetTSCKHz(khz uint32) error {
	_, err := ioctlArg(c.fd, kvmSetTSCKHz, uintptr(khz))
	if err != nil {
		return fmt.Errorf("kvm: vcpu %d: KVM_SET_TSC_KHZ %d: %w", c.id, khz, err)
	}
	return nil
}

// KVMClockCtrl tells the guest's kvmclock that the vCPU was paused, so its
// soft-lockup watchdog does not fire after a resume. EINVAL means the guest
// has not enabled kvmclock yet.
func (c *VCPU) KVMClockCtrl() error {
	_, err := ioctlArg(c.fd, kvmKVMClockCtrl, 0)
	if err != nil {
		return fmt.Errorf("kvm: vcpu %d: KVM_KVMCLOCK_CTRL: %w", c.id, err)
	}
	return nil
}
