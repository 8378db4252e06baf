package kvm

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// layoutC prints "name value" lines for every struct size, field offset,
// ioctl number and constant that our Go mirror must agree with.
const layoutC = `
#include <stdio.h>
#include <stddef.h>
#include <linux/kvm.h>
#define S(t) printf("sizeof_" #t " %lu\n", (unsigned long)sizeof(struct t));
#define O(t, f) printf("offsetof_" #t "." #f " %lu\n", (unsigned long)offsetof(struct t, f));
#define V(c) printf(#c " %lu\n", (unsigned long)(c));
int main(void) {
	S(kvm_userspace_memory_region) S(kvm_regs) S(kvm_segment) S(kvm_dtable) S(kvm_sregs)
	S(kvm_fpu) S(kvm_xsave) S(kvm_xcr) S(kvm_xcrs) S(kvm_lapic_state) S(kvm_msr_entry) S(kvm_msrs)
	S(kvm_msr_list) S(kvm_mp_state) S(kvm_vcpu_events) S(kvm_debugregs) S(kvm_cpuid_entry2)
	S(kvm_cpuid2) S(kvm_clock_data) S(kvm_irqchip) S(kvm_pit_channel_state) S(kvm_pit_state2)
	S(kvm_pit_config) S(kvm_irqfd) S(kvm_ioeventfd) S(kvm_dirty_log) S(kvm_irq_level) S(kvm_msi)
	S(kvm_irq_routing_entry) S(kvm_irq_routing) S(kvm_enable_cap)
	O(kvm_userspace_memory_region, userspace_addr)
	O(kvm_regs, rip) O(kvm_regs, rflags) O(kvm_regs, r15)
	O(kvm_segment, selector) O(kvm_segment, type) O(kvm_segment, unusable)
	O(kvm_sregs, tr) O(kvm_sregs, gdt) O(kvm_sregs, idt) O(kvm_sregs, cr0) O(kvm_sregs, efer)
	O(kvm_sregs, apic_base) O(kvm_sregs, interrupt_bitmap)
	O(kvm_fpu, last_ip) O(kvm_fpu, xmm) O(kvm_fpu, mxcsr)
	O(kvm_xcrs, xcrs) O(kvm_xcrs, padding)
	O(kvm_vcpu_events, interrupt) O(kvm_vcpu_events, nmi) O(kvm_vcpu_events, sipi_vector)
	O(kvm_vcpu_events, flags) O(kvm_vcpu_events, smi) O(kvm_vcpu_events, triple_fault)
	O(kvm_vcpu_events, reserved) O(kvm_vcpu_events, exception_has_payload)
	O(kvm_vcpu_events, exception_payload)
	O(kvm_debugregs, dr6) O(kvm_debugregs, dr7) O(kvm_debugregs, flags)
	O(kvm_cpuid_entry2, eax) O(kvm_cpuid_entry2, edx) O(kvm_cpuid2, entries)
	O(kvm_clock_data, flags) O(kvm_clock_data, realtime) O(kvm_clock_data, host_tsc)
	O(kvm_irqchip, chip) O(kvm_pit_channel_state, count_load_time) O(kvm_pit_state2, flags)
	O(kvm_irqfd, resamplefd) O(kvm_ioeventfd, len) O(kvm_ioeventfd, fd) O(kvm_ioeventfd, flags)
	O(kvm_msrs, entries) O(kvm_msr_list, indices) O(kvm_irq_routing, entries)
	O(kvm_irq_routing_entry, u) O(kvm_enable_cap, args)
	O(kvm_run, immediate_exit) O(kvm_run, exit_reason) O(kvm_run, io) O(kvm_run, io.port)
	O(kvm_run, io.count) O(kvm_run, io.data_offset) O(kvm_run, mmio.phys_addr) O(kvm_run, mmio.data)
	O(kvm_run, mmio.len) O(kvm_run, mmio.is_write) O(kvm_run, fail_entry.cpu)
	O(kvm_run, internal.ndata) O(kvm_run, internal.data) O(kvm_run, system_event.ndata)
	O(kvm_run, system_event.data) O(kvm_run, kvm_valid_regs)
	V(KVM_API_VERSION) V(KVM_GET_API_VERSION) V(KVM_CREATE_VM) V(KVM_GET_MSR_INDEX_LIST)
	V(KVM_CHECK_EXTENSION) V(KVM_GET_VCPU_MMAP_SIZE) V(KVM_GET_SUPPORTED_CPUID) V(KVM_CREATE_VCPU)
	V(KVM_GET_DIRTY_LOG) V(KVM_SET_USER_MEMORY_REGION) V(KVM_SET_TSS_ADDR)
	V(KVM_SET_IDENTITY_MAP_ADDR) V(KVM_CREATE_IRQCHIP) V(KVM_IRQ_LINE) V(KVM_GET_IRQCHIP)
	V(KVM_SET_IRQCHIP) V(KVM_SET_GSI_ROUTING) V(KVM_IRQFD) V(KVM_CREATE_PIT2) V(KVM_IOEVENTFD)
	V(KVM_SET_CLOCK) V(KVM_GET_CLOCK) V(KVM_GET_PIT2) V(KVM_SET_PIT2) V(KVM_ENABLE_CAP)
	V(KVM_SIGNAL_MSI) V(KVM_RUN) V(KVM_GET_REGS) V(KVM_SET_REGS) V(KVM_GET_SREGS) V(KVM_SET_SREGS)
	V(KVM_GET_MSRS) V(KVM_SET_MSRS) V(KVM_GET_FPU) V(KVM_SET_FPU) V(KVM_GET_LAPIC) V(KVM_SET_LAPIC)
	V(KVM_SET_CPUID2) V(KVM_GET_CPUID2) V(KVM_GET_MP_STATE) V(KVM_SET_MP_STATE)
	V(KVM_GET_VCPU_EVENTS) V(KVM_SET_VCPU_EVENTS) V(KVM_GET_DEBUGREGS) V(KVM_SET_DEBUGREGS)
	V(KVM_SET_TSC_KHZ) V(KVM_GET_TSC_KHZ) V(KVM_GET_XSAVE) V(KVM_SET_XSAVE) V(KVM_GET_XCRS)
	V(KVM_SET_XCRS) V(KVM_KVMCLOCK_CTRL) V(KVM_GET_XSAVE2)
	V(KVM_CAP_IRQCHIP) V(KVM_CAP_USER_MEMORY) V(KVM_CAP_SET_TSS_ADDR) V(KVM_CAP_EXT_CPUID)
	V(KVM_CAP_NR_MEMSLOTS) V(KVM_CAP_MP_STATE) V(KVM_CAP_IRQ_ROUTING) V(KVM_CAP_IRQFD)
	V(KVM_CAP_PIT2) V(KVM_CAP_IOEVENTFD) V(KVM_CAP_ADJUST_CLOCK) V(KVM_CAP_VCPU_EVENTS)
	V(KVM_CAP_DEBUGREGS) V(KVM_CAP_XSAVE) V(KVM_CAP_XCRS) V(KVM_CAP_TSC_CONTROL)
	V(KVM_CAP_GET_TSC_KHZ) V(KVM_CAP_KVMCLOCK_CTRL) V(KVM_CAP_SIGNAL_MSI) V(KVM_CAP_IMMEDIATE_EXIT)
	V(KVM_CAP_XSAVE2)
	V(KVM_CAP_EXCEPTION_PAYLOAD)
	V(KVM_EXIT_IO) V(KVM_EXIT_HLT) V(KVM_EXIT_MMIO) V(KVM_EXIT_SHUTDOWN) V(KVM_EXIT_FAIL_ENTRY)
	V(KVM_EXIT_INTERNAL_ERROR) V(KVM_EXIT_SYSTEM_EVENT) V(KVM_EXIT_IOAPIC_EOI) V(KVM_EXIT_INTR)
	V(KVM_MEM_LOG_DIRTY_PAGES) V(KVM_MEM_READONLY) V(KVM_IRQFD_FLAG_DEASSIGN)
	V(KVM_IOEVENTFD_FLAG_DATAMATCH) V(KVM_IOEVENTFD_FLAG_PIO) V(KVM_IOEVENTFD_FLAG_DEASSIGN)
	V(KVM_PIT_SPEAKER_DUMMY) V(KVM_MP_STATE_RUNNABLE) V(KVM_MP_STATE_HALTED)
	V(KVM_SYSTEM_EVENT_SHUTDOWN) V(KVM_SYSTEM_EVENT_RESET) V(KVM_SYSTEM_EVENT_CRASH)
	V(KVM_CLOCK_TSC_STABLE) V(KVM_CLOCK_REALTIME) V(KVM_CLOCK_HOST_TSC)
	V(KVM_IRQ_ROUTING_IRQCHIP) V(KVM_IRQ_ROUTING_MSI) V(KVM_MAX_XCRS) V(KVM_APIC_REG_SIZE)
	return 0;
}
`

// goLayout is the Go side of every line layoutC prints.
func goLayout() map[string]uintptr {
	var ev VCPUEvents
	var sr Sregs
	return map[string]uintptr{
		"sizeof_kvm_userspace_memory_region": unsafe.Sizeof(UserspaceMemoryRegion{}),
		"sizeof_kvm_regs":                    unsafe.Sizeof(Regs{}),
		"sizeof_kvm_segment":                 unsafe.Sizeof(Segment{}),
		"sizeof_kvm_dtable":                  unsafe.Sizeof(DTable{}),
		"sizeof_kvm_sregs":                   unsafe.Sizeof(Sregs{}),
		"sizeof_kvm_fpu":                     unsafe.Sizeof(FPU{}),
		"sizeof_kvm_xsave":                   unsafe.Sizeof(XSave{}),
		"sizeof_kvm_xcr":                     unsafe.Sizeof(XCR{}),
		"sizeof_kvm_xcrs":                    unsafe.Sizeof(XCRs{}),
		"sizeof_kvm_lapic_state":             unsafe.Sizeof(LAPICState{}),
		"sizeof_kvm_msr_entry":               unsafe.Sizeof(MSREntry{}),
		"sizeof_kvm_msrs":                    unsafe.Sizeof(msrsHeader{}),
		"sizeof_kvm_msr_list":                unsafe.Sizeof(msrListHeader{}),
		"sizeof_kvm_mp_state":                unsafe.Sizeof(MPState{}),
		"sizeof_kvm_vcpu_events":             unsafe.Sizeof(VCPUEvents{}),
		"sizeof_kvm_debugregs":               unsafe.Sizeof(DebugRegs{}),
		"sizeof_kvm_cpuid_entry2":            unsafe.Sizeof(CPUIDEntry2{}),
		"sizeof_kvm_cpuid2":                  unsafe.Sizeof(cpuid2Header{}),
		"sizeof_kvm_clock_data":              unsafe.Sizeof(ClockData{}),
		"sizeof_kvm_irqchip":                 unsafe.Sizeof(IRQChip{}),
		"sizeof_kvm_pit_channel_state":       unsafe.Sizeof(PITChannelState{}),
		"sizeof_kvm_pit_state2":              unsafe.Sizeof(PITState2{}),
		"sizeof_kvm_pit_config":              unsafe.Sizeof(PITConfig{}),
		"sizeof_kvm_irqfd":                   unsafe.Sizeof(IRQFD{}),
		"sizeof_kvm_ioeventfd":               unsafe.Sizeof(IOEventFD{}),
		"sizeof_kvm_dirty_log":               unsafe.Sizeof(dirtyLog{}),
		"sizeof_kvm_irq_level":               unsafe.Sizeof(IRQLevel{}),
		"sizeof_kvm_msi":                     unsafe.Sizeof(MSI{}),
		"sizeof_kvm_irq_routing_entry":       unsafe.Sizeof(IRQRoutingEntry{}),
		"sizeof_kvm_irq_routing":             unsafe.Sizeof(irqRoutingHeader{}),
		"sizeof_kvm_enable_cap":              unsafe.Sizeof(EnableCap{}),

		"offsetof_kvm_userspace_memory_region.userspace_addr": unsafe.Offsetof(UserspaceMemoryRegion{}.UserspaceAddr),
		"offsetof_kvm_regs.rip":                               unsafe.Offsetof(Regs{}.RIP),
		"offsetof_kvm_regs.rflags":                            unsafe.Offsetof(Regs{}.RFLAGS),
		"offsetof_kvm_regs.r15":                               unsafe.Offsetof(Regs{}.R15),
		"offsetof_kvm_segment.selector":                       unsafe.Offsetof(Segment{}.Selector),
		"offsetof_kvm_segment.type":                           unsafe.Offsetof(Segment{}.Type),
		"offsetof_kvm_segment.unusable":                       unsafe.Offsetof(Segment{}.Unusable),
		"offsetof_kvm_sregs.tr":                               unsafe.Offsetof(sr.TR),
		"offsetof_kvm_sregs.gdt":                              unsafe.Offsetof(sr.GDT),
		"offsetof_kvm_sregs.idt":                              unsafe.Offsetof(sr.IDT),
		"offsetof_kvm_sregs.cr0":                              unsafe.Offsetof(sr.CR0),
		"offsetof_kvm_sregs.efer":                             unsafe.Offsetof(sr.EFER),
		"offsetof_kvm_sregs.apic_base":                        unsafe.Offsetof(sr.APICBase),
		"offsetof_kvm_sregs.interrupt_bitmap":                 unsafe.Offsetof(sr.InterruptBitmap),
		"offsetof_kvm_fpu.last_ip":                            unsafe.Offsetof(FPU{}.LastIP),
		"offsetof_kvm_fpu.xmm":                                unsafe.Offsetof(FPU{}.XMM),
		"offsetof_kvm_fpu.mxcsr":                              unsafe.Offsetof(FPU{}.MXCSR),
		"offsetof_kvm_xcrs.xcrs":                              unsafe.Offsetof(XCRs{}.XCRs),
		"offsetof_kvm_xcrs.padding":                           unsafe.Offsetof(XCRs{}.Padding),
		"offsetof_kvm_vcpu_events.interrupt":                  unsafe.Offsetof(ev.Interrupt),
		"offsetof_kvm_vcpu_events.nmi":                        unsafe.Offsetof(ev.NMI),
		"offsetof_kvm_vcpu_events.sipi_vector":                unsafe.Offsetof(ev.SIPIVector),
		"offsetof_kvm_vcpu_events.flags":                      unsafe.Offsetof(ev.Flags),
		"offsetof_kvm_vcpu_events.smi":                        unsafe.Offsetof(ev.SMI),
		"offsetof_kvm_vcpu_events.triple_fault":               unsafe.Offsetof(ev.TripleFaultPending),
		"offsetof_kvm_vcpu_events.reserved":                   unsafe.Offsetof(ev.Reserved),
		"offsetof_kvm_vcpu_events.exception_has_payload":      unsafe.Offsetof(ev.ExceptionHasPayload),
		"offsetof_kvm_vcpu_events.exception_payload":          unsafe.Offsetof(ev.ExceptionPayload),
		"offsetof_kvm_debugregs.dr6":                          unsafe.Offsetof(DebugRegs{}.DR6),
		"offsetof_kvm_debugregs.dr7":                          unsafe.Offsetof(DebugRegs{}.DR7),
		"offsetof_kvm_debugregs.flags":                        unsafe.Offsetof(DebugRegs{}.Flags),
		"offsetof_kvm_cpuid_entry2.eax":                       unsafe.Offsetof(CPUIDEntry2{}.EAX),
		"offsetof_kvm_cpuid_entry2.edx":                       unsafe.Offsetof(CPUIDEntry2{}.EDX),
		"offsetof_kvm_cpuid2.entries":                         unsafe.Sizeof(cpuid2Header{}),
		"offsetof_kvm_clock_data.flags":                       unsafe.Offsetof(ClockData{}.Flags),
		"offsetof_kvm_clock_data.realtime":                    unsafe.Offsetof(ClockData{}.Realtime),
		"offsetof_kvm_clock_data.host_tsc":                    unsafe.Offsetof(ClockData{}.HostTSC),
		"offsetof_kvm_irqchip.chip":                           unsafe.Offsetof(IRQChip{}.Chip),
		"offsetof_kvm_pit_channel_state.count_load_time":      unsafe.Offsetof(PITChannelState{}.CountLoadTime),
		"offsetof_kvm_pit_state2.flags":                       unsafe.Offsetof(PITState2{}.Flags),
		"offsetof_kvm_irqfd.resamplefd":                       unsafe.Offsetof(IRQFD{}.ResampleFD),
		"offsetof_kvm_ioeventfd.len":                          unsafe.Offsetof(IOEventFD{}.Len),
		"offsetof_kvm_ioeventfd.fd":                           unsafe.Offsetof(IOEventFD{}.FD),
		"offsetof_kvm_ioeventfd.flags":                        unsafe.Offsetof(IOEventFD{}.Flags),
		"offsetof_kvm_msrs.entries":                           unsafe.Sizeof(msrsHeader{}),
		"offsetof_kvm_msr_list.indices":                       unsafe.Sizeof(msrListHeader{}),
		"offsetof_kvm_irq_routing.entries":                    unsafe.Sizeof(irqRoutingHeader{}),
		"offsetof_kvm_irq_routing_entry.u":                    unsafe.Offsetof(IRQRoutingEntry{}.U),
		"offsetof_kvm_enable_cap.args":                        unsafe.Offsetof(EnableCap{}.Args),

		// kvm_run is decoded by offset (run.go); these are those offsets.
		"offsetof_kvm_run.immediate_exit":     runImmediateExit,
		"offsetof_kvm_run.exit_reason":        runExitReason,
		"offsetof_kvm_run.io":                 runExitUnion,
		"offsetof_kvm_run.io.port":            runExitUnion + 2,
		"offsetof_kvm_run.io.count":           runExitUnion + 4,
		"offsetof_kvm_run.io.data_offset":     runExitUnion + 8,
		"offsetof_kvm_run.mmio.phys_addr":     runExitUnion,
		"offsetof_kvm_run.mmio.data":          runExitUnion + 8,
		"offsetof_kvm_run.mmio.len":           runExitUnion + 16,
		"offsetof_kvm_run.mmio.is_write":      runExitUnion + 20,
		"offsetof_kvm_run.fail_entry.cpu":     runExitUnion + 8,
		"offsetof_kvm_run.internal.ndata":     runExitUnion + 4,
		"offsetof_kvm_run.internal.data":      runExitUnion + 8,
		"offsetof_kvm_run.system_event.ndata": runExitUnion + 4,
		"offsetof_kvm_run.system_event.data":  runExitUnion + 8,
		"offsetof_kvm_run.kvm_valid_regs":     runExitUnion + runExitUnionSize,

		"KVM_API_VERSION":            APIVersion,
		"KVM_GET_API_VERSION":        kvmGetAPIVersion,
		"KVM_CREATE_VM":              kvmCreateVM,
		"KVM_GET_MSR_INDEX_LIST":     kvmGetMSRIndexList,
		"KVM_CHECK_EXTENSION":        kvmCheckExtension,
		"KVM_GET_VCPU_MMAP_SIZE":     kvmGetVCPUMmapSize,
		"KVM_GET_SUPPORTED_CPUID":    kvmGetSupportedCPUID,
		"KVM_CREATE_VCPU":            kvmCreateVCPU,
		"KVM_GET_DIRTY_LOG":          kvmGetDirtyLog,
		"KVM_SET_USER_MEMORY_REGION": kvmSetUserMemoryRegion,
		"KVM_SET_TSS_ADDR":           kvmSetTSSAddr,
		"KVM_SET_IDENTITY_MAP_ADDR":  kvmSetIdentityMapAddr,
		"KVM_CREATE_IRQCHIP":         kvmCreateIRQChip,
		"KVM_IRQ_LINE":               kvmIRQLine,
		"KVM_GET_IRQCHIP":            kvmGetIRQChip,
		"KVM_SET_IRQCHIP":            kvmSetIRQChip,
		"KVM_SET_GSI_ROUTING":        kvmSetGSIRouting,
		"KVM_IRQFD":                  kvmIRQFD,
		"KVM_CREATE_PIT2":            kvmCreatePIT2,
		"KVM_IOEVENTFD":              kvmIOEventFD,
		"KVM_SET_CLOCK":              kvmSetClock,
		"KVM_GET_CLOCK":              kvmGetClock,
		"KVM_GET_PIT2":               kvmGetPIT2,
		"KVM_SET_PIT2":               kvmSetPIT2,
		"KVM_ENABLE_CAP":             kvmEnableCap,
		"KVM_SIGNAL_MSI":             kvmSignalMSI,
		"KVM_RUN":                    kvmRun,
		"KVM_GET_REGS":               kvmGetRegs,
		"KVM_SET_REGS":               kvmSetRegs,
		"KVM_GET_SREGS":              kvmGetSregs,
		"KVM_SET_SREGS":              kvmSetSregs,
		"KVM_GET_MSRS":               kvmGetMSRs,
		"KVM_SET_MSRS":               kvmSetMSRs,
		"KVM_GET_FPU":                kvmGetFPU,
		"KVM_SET_FPU":                kvmSetFPU,
		"KVM_GET_LAPIC":              kvmGetLAPIC,
		"KVM_SET_LAPIC":              kvmSetLAPIC,
		"KVM_SET_CPUID2":             kvmSetCPUID2,
		"KVM_GET_CPUID2":             kvmGetCPUID2,
		"KVM_GET_MP_STATE":           kvmGetMPState,
		"KVM_SET_MP_STATE":           kvmSetMPState,
		"KVM_GET_VCPU_EVENTS":        kvmGetVCPUEvents,
		"KVM_SET_VCPU_EVENTS":        kvmSetVCPUEvents,
		"KVM_GET_DEBUGREGS":          kvmGetDebugRegs,
		"KVM_SET_DEBUGREGS":          kvmSetDebugRegs,
		"KVM_SET_TSC_KHZ":            kvmSetTSCKHz,
		"KVM_GET_TSC_KHZ":            kvmGetTSCKHz,
		"KVM_GET_XSAVE":              kvmGetXSave,
		"KVM_SET_XSAVE":              kvmSetXSave,
		"KVM_GET_XCRS":               kvmGetXCRs,
		"KVM_SET_XCRS":               kvmSetXCRs,
		"KVM_KVMCLOCK_CTRL":          kvmKVMClockCtrl,
		"KVM_GET_XSAVE2":             kvmGetXSave2,

		"KVM_CAP_IRQCHIP": CapIRQChip, "KVM_CAP_USER_MEMORY": CapUserMemory,
		"KVM_CAP_SET_TSS_ADDR": CapSetTSSAddr, "KVM_CAP_EXT_CPUID": CapExtCPUID,
		"KVM_CAP_NR_MEMSLOTS": CapNrMemslots, "KVM_CAP_MP_STATE": CapMPState,
		"KVM_CAP_IRQ_ROUTING": CapIRQRouting, "KVM_CAP_IRQFD": CapIRQFD, "KVM_CAP_PIT2": CapPIT2,
		"KVM_CAP_IOEVENTFD": CapIOEventFD, "KVM_CAP_ADJUST_CLOCK": CapAdjustClock,
		"KVM_CAP_VCPU_EVENTS": CapVCPUEvents, "KVM_CAP_DEBUGREGS": CapDebugRegs,
		"KVM_CAP_XSAVE": CapXSave, "KVM_CAP_XCRS": CapXCRs, "KVM_CAP_TSC_CONTROL": CapTSCControl,
		"KVM_CAP_GET_TSC_KHZ": CapGetTSCKHz, "KVM_CAP_KVMCLOCK_CTRL": CapKVMClockCtrl,
		"KVM_CAP_SIGNAL_MSI": CapSignalMSI, "KVM_CAP_IMMEDIATE_EXIT": CapImmediateExit,
		"KVM_CAP_XSAVE2":            CapXSave2,
		"KVM_CAP_EXCEPTION_PAYLOAD": CapExceptionPayload,

		"KVM_EXIT_IO": uintptr(ExitIO), "KVM_EXIT_HLT": uintptr(ExitHLT), "KVM_EXIT_MMIO": uintptr(ExitMMIO),
		"KVM_EXIT_SHUTDOWN": uintptr(ExitShutdown), "KVM_EXIT_FAIL_ENTRY": uintptr(ExitFailEntry),
		"KVM_EXIT_INTERNAL_ERROR": uintptr(ExitInternalError), "KVM_EXIT_SYSTEM_EVENT": uintptr(ExitSystemEvent),
		"KVM_EXIT_IOAPIC_EOI": uintptr(ExitIOAPICEOI), "KVM_EXIT_INTR": uintptr(ExitIntr),

		"KVM_MEM_LOG_DIRTY_PAGES": MemLogDirtyPages, "KVM_MEM_READONLY": MemReadonly,
		"KVM_IRQFD_FLAG_DEASSIGN":      IRQFDDeassign,
		"KVM_IOEVENTFD_FLAG_DATAMATCH": IOEventFDDataMatch, "KVM_IOEVENTFD_FLAG_PIO": IOEventFDPIO,
		"KVM_IOEVENTFD_FLAG_DEASSIGN": IOEventFDDeassign, "KVM_PIT_SPEAKER_DUMMY": PITSpeakerDummy,
		"KVM_MP_STATE_RUNNABLE": MPStateRunnable, "KVM_MP_STATE_HALTED": MPStateHalted,
		"KVM_SYSTEM_EVENT_SHUTDOWN": SystemEventShutdown, "KVM_SYSTEM_EVENT_RESET": SystemEventReset,
		"KVM_SYSTEM_EVENT_CRASH": SystemEventCrash,
		"KVM_CLOCK_TSC_STABLE":   ClockTSCStable, "KVM_CLOCK_REALTIME": ClockRealtime, "KVM_CLOCK_HOST_TSC": ClockHostTSC,
		"KVM_IRQ_ROUTING_IRQCHIP": IRQRoutingIRQChip, "KVM_IRQ_ROUTING_MSI": IRQRoutingMSI,
		"KVM_MAX_XCRS": MaxXCRs, "KVM_APIC_REG_SIZE": unsafe.Sizeof(LAPICState{}),
	}
}

// TestLayoutAgainstHeader compiles layoutC against the installed UAPI
// headers and checks every value against the Go mirror. It needs gcc and
// linux-libc-dev; both are part of the build image, so their absence is a
// skip with a reason, not a pass.
func TestLayoutAgainstHeader(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not installed: cannot compile the <linux/kvm.h> layout probe")
	}
	if _, err := os.Stat("/usr/include/linux/kvm.h"); err != nil {
		t.Skip("/usr/include/linux/kvm.h missing (install linux-libc-dev): cannot check layouts")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "layout.c")
	bin := filepath.Join(dir, "layout")
	if err := os.WriteFile(src, []byte(layoutC), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("compile layout probe: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("run layout probe: %v", err)
	}
	want := goLayout()
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			t.Fatalf("bad probe line %q", sc.Text())
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			t.Fatalf("bad probe value %q", sc.Text())
		}
		g, ok := want[f[0]]
		if !ok {
			t.Errorf("%s: printed by the C probe but missing on the Go side", f[0])
			continue
		}
		seen[f[0]] = true
		if uint64(g) != v {
			t.Errorf("%s: header says %#x, Go has %#x", f[0], v, g)
		}
	}
	for k := range want {
		if !seen[k] {
			t.Errorf("%s: on the Go side but not printed by the C probe", k)
		}
	}
}
