package boot

import (
	"fmt"

	"github.com/cube-runtime/cube/hypervisor/kvm"
)

// CPUID adapts KVM's supported CPUID table for vCPU apicID of n: the APIC
// ids the guest reads must match the MADT, and the topology leaves must
// agree with the vCPU count.
func CPUID(supported []kvm.CPUIDEntry2, apicID, n int) []kvm.CPUIDEntry2 {
	out := append([]kvm.CPUIDEntry2(nil), supported...)
	for i := range out {
		e := &out[i]
		switch e.Function {
		case 1:
			// EBX[31:24] initial APIC id, EBX[23:16] logical processors.
			e.EBX = e.EBX&0x0000ffff | uint32(apicID)<<24 | uint32(n&0xff)<<16
			if n > 1 {
				e.EDX |= 1 << 28 // HTT: the count above is valid
			}
			e.ECX |= 1 << 31 // hypervisor present
		case 0xb, 0x1f:
			// x2APIC topology: EDX is the x2APIC id on every subleaf.
			e.EDX = uint32(apicID)
		}
	}
	return out
}

// x86 MSRs set at boot.
const (
	msrIA32SysenterCS  = 0x174
	msrIA32SysenterESP = 0x175
	msrIA32SysenterEIP = 0x176
	msrSTAR            = 0xc0000081
	msrLSTAR           = 0xc0000082
	msrCSTAR           = 0xc0000083
	msrSyscallMask     = 0xc0000084
	msrKernelGSBase    = 0xc0000102
	msrIA32TSC         = 0x10
	msrIA32MiscEnable  = 0x1a0
	msrMTRRDefType     = 0x2ff

	miscEnableFastString = 1 << 0
	mtrrEnable           = 1 << 11
	mtrrTypeWB           = 6
)

// BootMSRs are the MSR values a freshly booted vCPU gets. MTRRs enabled
// with write-back default matter most: without them the guest may treat
// all RAM as uncached.
func BootMSRs() []kvm.MSREntry {
	return []kvm.MSREntry{
		{Index: msrIA32SysenterCS}, {Index: msrIA32SysenterESP}, {Index: msrIA32SysenterEIP},
		{Index: msrSTAR}, {Index: msrCSTAR}, {Index: msrKernelGSBase}, {Index: msrSyscallMask},
		{Index: msrLSTAR}, {Index: msrIA32TSC},
		{Index: msrIA32MiscEnable, Data: miscEnableFastString},
		{Index: msrMTRRDefType, Data: mtrrEnable | mtrrTypeWB},
	}
}

// Sregs puts s into 64-bit mode per the boot protocol: paging on with the
// boot page tables, CS = __BOOT_CS, data segments = __BOOT_DS.
func Sregs(s kvm.Sregs) kvm.Sregs {
	code := kvm.Segment{Limit: 0xffffffff, Selector: BootCS, Type: 0xb, Present: 1, S: 1, L: 1, G: 1}
	data := kvm.Segment{Limit: 0xffffffff, Selector: BootDS, Type: 0x3, Present: 1, S: 1, DB: 1, G: 1}
	s.CS = code
	s.DS, s.ES, s.FS, s.GS, s.SS = data, data, data, data, data
	s.TR = kvm.Segment{Limit: 0x67, Selector: BootTR, Type: 0xb, Present: 1}
	s.GDT = kvm.DTable{Base: GDTAddr, Limit: uint16(len(GDT()) - 1)}
	s.IDT = kvm.DTable{}
	const (
		cr0PE   = 1 << 0
		cr0MP   = 1 << 1
		cr0ET   = 1 << 4
		cr0NE   = 1 << 5
		cr0WP   = 1 << 16
		cr0AM   = 1 << 18
		cr0PG   = 1 << 31
		cr4PAE  = 1 << 5
		eferSCE = 1 << 0
		eferLME = 1 << 8
		eferLMA = 1 << 10
	)
	s.CR0 = cr0PE | cr0MP | cr0ET | cr0NE | cr0WP | cr0AM | cr0PG
	s.CR3 = PML4Addr
	s.CR4 = cr4PAE
	s.EFER = eferLME | eferLMA
	return s
}

// Regs is the boot processor's register file at the 64-bit entry point:
// RSI points at the zero page; interrupts are off.
func Regs(entry, zeroPage uint64) kvm.Regs {
	return kvm.Regs{RIP: entry, RSI: zeroPage, RFLAGS: 2, RSP: 0x8ff0}
}

// FPU is the x87/SSE reset state (FNINIT control word, default MXCSR).
func FPU() kvm.FPU {
	return kvm.FPU{FCW: 0x37f, MXCSR: 0x1f80}
}

// LAPIC offsets and delivery modes used to wire LINT0/LINT1.
const (
	apicLVT0       = 0x350
	apicLVT1       = 0x360
	apicModeNMI    = 0x4
	apicModeExtINT = 0x7
)

// LAPIC routes LINT0 to ExtINT (the PIC) and LINT1 to NMI, as a PC BIOS
// leaves them; Linux relies on it for the timer check through the PIC.
func LAPIC(l kvm.LAPICState) kvm.LAPICState {
	set := func(off int, mode uint32) {
		v := le.Uint32(l.Regs[off:])
		v = v&^0x700 | mode<<8
		le.PutUint32(l.Regs[off:], v)
	}
	set(apicLVT0, apicModeExtINT)
	set(apicLVT1, apicModeNMI)
	return l
}

// ConfigureVCPU applies CPUID, MSRs, FPU and LAPIC to any vCPU, and the
// boot registers to the boot processor (id 0); application processors
// wait for the guest's INIT/SIPI. Order: CPUID before MSRs (KVM filters
// MSRs by CPUID features), LAPIC after the irqchip exists.
func ConfigureVCPU(cpu *kvm.VCPU, supported []kvm.CPUIDEntry2, n int, entry, zeroPage uint64) error {
	id := cpu.ID()
	if err := cpu.SetCPUID2(CPUID(supported, id, n)); err != nil {
		return fmt.Errorf("vcpu %d: %w", id, err)
	}
	if err := cpu.SetMSRs(BootMSRs()); err != nil {
		return fmt.Errorf("vcpu %d: %w", id, err)
	}
	if err := cpu.SetFPU(FPU()); err != nil {
		return fmt.Errorf("vcpu %d: %w", id, err)
	}
	l, err := cpu.GetLAPIC()
	if err != nil {
		return fmt.Errorf("vcpu %d: %w", id, err)
	}
	if err := cpu.SetLAPIC(LAPIC(l)); err != nil {
		return fmt.Errorf("vcpu %d: %w", id, err)
	}
	if id != 0 {
		return nil
	}
	s, err := cpu.GetSregs()
	if err != nil {
		return fmt.Errorf("vcpu %d: %w", id, err)
	}
	if err := cpu.SetSregs(Sregs(s)); err != nil {
		return fmt.Errorf("vcpu %d: %w", id, err)
	}
	if err := cpu.SetRegs(Regs(entry, zeroPage)); err != nil {
		return fmt.Errorf("vcpu %d: %w", id, err)
	}
	return nil
}
