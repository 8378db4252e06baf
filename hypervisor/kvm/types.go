package kvm

import "unsafe"

// The structs below mirror <linux/kvm.h> and <asm/kvm.h> (x86-64) as shipped
// with Linux 6.1 UAPI headers (KVM_API_VERSION 12). layout_test.go compiles a
// C program against the installed headers and compares every size and the
// offsets that matter; keep the field order identical to the kernel's.

// APIVersion is the only KVM API version that exists (KVM_API_VERSION).
const APIVersion = 12

// UserspaceMemoryRegion is struct kvm_userspace_memory_region.
type UserspaceMemoryRegion struct {
	Slot          uint32
	Flags         uint32
	GuestPhysAddr uint64
	MemorySize    uint64
	UserspaceAddr uint64
}

// Memory region flags.
const (
	MemLogDirtyPages = 1 << 0
	MemReadonly      = 1 << 1
)

// Regs is struct kvm_regs.
type Regs struct {
	RAX, RBX, RCX, RDX uint64
	RSI, RDI, RSP, RBP uint64
	R8, R9, R10, R11   uint64
	R12, R13, R14, R15 uint64
	RIP, RFLAGS        uint64
}

// Segment is struct kvm_segment.
type Segment struct {
	Base     uint64
	Limit    uint32
	Selector uint16
	Type     uint8
	Present  uint8
	DPL      uint8
	DB       uint8
	S        uint8
	L        uint8
	G        uint8
	AVL      uint8
	Unusable uint8
	_        uint8
}

// DTable is struct kvm_dtable.
type DTable struct {
	Base  uint64
	Limit uint16
	_     [3]uint16
}

// Sregs is struct kvm_sregs.
type Sregs struct {
	CS, DS, ES, FS, GS, SS Segment
	TR, LDT                Segment
	GDT, IDT               DTable
	CR0, CR2, CR3, CR4     uint64
	CR8                    uint64
	EFER                   uint64
	APICBase               uint64
	InterruptBitmap        [4]uint64 // (KVM_NR_INTERRUPTS+63)/64
}

// FPU is struct kvm_fpu.
type FPU struct {
	FPR        [8][16]uint8
	FCW        uint16
	FSW        uint16
	FTWX       uint8
	_          uint8
	LastOpcode uint16
	LastIP     uint64
	LastDP     uint64
	XMM        [16][16]uint8
	MXCSR      uint32
	_          uint32
}

// XSave is struct kvm_xsave without its flexible tail (KVM_GET_XSAVE).
type XSave struct {
	Region [1024]uint32
}

// XCR is struct kvm_xcr.
type XCR struct {
	XCR      uint32
	Reserved uint32
	Value    uint64
}

// MaxXCRs is KVM_MAX_XCRS.
const MaxXCRs = 16

// XCRs is struct kvm_xcrs.
type XCRs struct {
	NrXCRs  uint32
	Flags   uint32
	XCRs    [MaxXCRs]XCR
	Padding [16]uint64
}

// LAPICState is struct kvm_lapic_state (KVM_APIC_REG_SIZE bytes of APIC page).
type LAPICState struct {
	Regs [0x400]byte
}

// MSREntry is struct kvm_msr_entry.
type MSREntry struct {
	Index    uint32
	Reserved uint32
	Data     uint64
}

// msrsHeader is struct kvm_msrs without its flexible entries array.
type msrsHeader struct {
	NMSRs uint32
	Pad   uint32
}

// msrListHeader is struct kvm_msr_list without its indices.
type msrListHeader struct {
	NMSRs uint32
}

// MPState is struct kvm_mp_state.
type MPState struct {
	MPState uint32
}

// MP states (KVM_MP_STATE_*).
const (
	MPStateRunnable      = 0
	MPStateUninitialized = 1
	MPStateInitReceived  = 2
	MPStateHalted        = 3
	MPStateSipiReceived  = 4
)

// VCPUEvents is struct kvm_vcpu_events.
type VCPUEvents struct {
	Exception struct {
		Injected     uint8
		Nr           uint8
		HasErrorCode uint8
		Pending      uint8
		ErrorCode    uint32
	}
	Interrupt struct {
		Injected uint8
		Nr       uint8
		Soft     uint8
		Shadow   uint8
	}
	NMI struct {
		Injected uint8
		Pending  uint8
		Masked   uint8
		Pad      uint8
	}
	SIPIVector uint32
	Flags      uint32
	SMI        struct {
		SMM          uint8
		Pending      uint8
		SMMInsideNMI uint8
		LatchedInit  uint8
	}
	TripleFaultPending  uint8
	Reserved            [26]uint8
	ExceptionHasPayload uint8
	ExceptionPayload    uint64
}

// DebugRegs is struct kvm_debugregs.
type DebugRegs struct {
	DB       [4]uint64
	DR6      uint64
	DR7      uint64
	Flags    uint64
	Reserved [9]uint64
}

// CPUIDEntry2 is struct kvm_cpuid_entry2.
type CPUIDEntry2 struct {
	Function uint32
	Index    uint32
	Flags    uint32
	EAX      uint32
	EBX      uint32
	ECX      uint32
	EDX      uint32
	_        [3]uint32
}

// CPUID entry flags.
const (
	CPUIDFlagSignificantIndex = 1 << 0
)

// cpuid2Header is struct kvm_cpuid2 without its entries.
type cpuid2Header struct {
	NEnt uint32
	Pad  uint32
}

// MaxCPUIDEntries bounds the CPUID tables we exchange with KVM (QEMU and
// Firecracker use 256 too; the kernel's own limit is KVM_MAX_CPUID_ENTRIES=256).
const MaxCPUIDEntries = 256

// ClockData is struct kvm_clock_data.
type ClockData struct {
	Clock    uint64
	Flags    uint32
	_        uint32
	Realtime uint64
	HostTSC  uint64
	_        [4]uint32
}

// Clock flags.
const (
	ClockTSCStable = 2
	ClockRealtime  = 1 << 2
	ClockHostTSC   = 1 << 3
)

// IRQChip is struct kvm_irqchip. The chip union is kept as raw bytes: a
// snapshot stores it opaquely; decoding is left to whoever needs it.
type IRQChip struct {
	ChipID uint32
	_      uint32
	Chip   [512]byte
}

// Chip ids for IRQChip.ChipID.
const (
	IRQChipPICMaster = 0
	IRQChipPICSlave  = 1
	IRQChipIOAPIC    = 2
)

// PITChannelState is struct kvm_pit_channel_state.
type PITChannelState struct {
	Count         uint32
	LatchedCount  uint16
	CountLatched  uint8
	StatusLatched uint8
	Status        uint8
	ReadState     uint8
	WriteState    uint8
	WriteLatch    uint8
	RWMode        uint8
	Mode          uint8
	BCD           uint8
	Gate          uint8
	CountLoadTime int64
}

// PITState2 is struct kvm_pit_state2.
type PITState2 struct {
	Channels [3]PITChannelState
	Flags    uint32
	Reserved [9]uint32
}

// PITConfig is struct kvm_pit_config.
type PITConfig struct {
	Flags uint32
	_     [15]uint32
}

// PITSpeakerDummy is KVM_PIT_SPEAKER_DUMMY: emulate port 0x61 in the kernel.
const PITSpeakerDummy = 1

// IRQFD is struct kvm_irqfd.
type IRQFD struct {
	FD         uint32
	GSI        uint32
	Flags      uint32
	ResampleFD uint32
	_          [16]uint8
}

// IRQFD flags.
const (
	IRQFDDeassign = 1 << 0
	IRQFDResample = 1 << 1
)

// IOEventFD is struct kvm_ioeventfd.
type IOEventFD struct {
	DataMatch uint64
	Addr      uint64
	Len       uint32
	FD        int32
	Flags     uint32
	_         [36]uint8
}

// IOEventFD flags.
const (
	IOEventFDDataMatch = 1 << 0
	IOEventFDPIO       = 1 << 1
	IOEventFDDeassign  = 1 << 2
)

// dirtyLog is struct kvm_dirty_log (the bitmap pointer is a __u64 union).
type dirtyLog struct {
	Slot   uint32
	_      uint32
	Bitmap uint64
}

// IRQLevel is struct kvm_irq_level.
type IRQLevel struct {
	IRQ   uint32
	Level uint32
}

// MSI is struct kvm_msi.
type MSI struct {
	AddressLo uint32
	AddressHi uint32
	Data      uint32
	Flags     uint32
	DevID     uint32
	_         [12]uint8
}

// IRQRoutingEntry is struct kvm_irq_routing_entry. U holds the type-specific
// union (irqchip: chip, pin; msi: address_lo, address_hi, data, devid).
type IRQRoutingEntry struct {
	GSI   uint32
	Type  uint32
	Flags uint32
	_     uint32
	U     [8]uint32
}

// Routing entry types.
const (
	IRQRoutingIRQChip = 1
	IRQRoutingMSI     = 2
)

// irqRoutingHeader is struct kvm_irq_routing without its entries.
type irqRoutingHeader struct {
	NR    uint32
	Flags uint32
}

// EnableCap is struct kvm_enable_cap.
type EnableCap struct {
	Cap   uint32
	Flags uint32
	Args  [4]uint64
	_     [64]uint8
}

// Capabilities (KVM_CAP_*) we check for.
const (
	CapIRQChip       = 0
	CapUserMemory    = 3
	CapSetTSSAddr    = 4
	CapExtCPUID      = 7
	CapNrMemslots    = 10
	CapMPState       = 14
	CapIRQRouting    = 25
	CapIRQFD         = 32
	CapPIT2          = 33
	CapIOEventFD     = 36
	CapAdjustClock   = 39
	CapVCPUEvents    = 41
	CapDebugRegs     = 50
	CapXSave         = 55
	CapXCRs          = 56
	CapTSCControl    = 60
	CapGetTSCKHz     = 61
	CapKVMClockCtrl  = 76
	CapSignalMSI     = 77
	CapImmediateExit = 136
	CapXSave2        = 208
	// CapExceptionPayload (KVM_CAP_EXCEPTION_PAYLOAD) is enabled per VM.
	CapExceptionPayload = 164
)

// Exit reasons (KVM_EXIT_*).
const (
	ExitUnknown       ExitReason = 0
	ExitException     ExitReason = 1
	ExitIO            ExitReason = 2
	ExitHypercall     ExitReason = 3
	ExitDebug         ExitReason = 4
	ExitHLT           ExitReason = 5
	ExitMMIO          ExitReason = 6
	ExitIRQWindowOpen ExitReason = 7
	ExitShutdown      ExitReason = 8
	ExitFailEntry     ExitReason = 9
	ExitIntr          ExitReason = 10
	ExitSetTPR        ExitReason = 11
	ExitTPRAccess     ExitReason = 12
	ExitNMI           ExitReason = 16
	ExitInternalError ExitReason = 17
	ExitSystemEvent   ExitReason = 24
	ExitIOAPICEOI     ExitReason = 26
)

// IO directions.
const (
	IODirIn  = 0
	IODirOut = 1
)

// System event types (KVM_SYSTEM_EVENT_*).
const (
	SystemEventShutdown = 1
	SystemEventReset    = 2
	SystemEventCrash    = 3
)

// Offsets inside struct kvm_run (checked by layout_test.go).
const (
	runImmediateExit = 1
	runExitReason    = 8
	runExitUnion     = 32
	runExitUnionSize = 256
)

// ioctl request numbers, derived from the struct sizes above exactly as the
// kernel's _IO* macros derive them; layout_test.go compares them to the
// header's values.
var (
	kvmGetAPIVersion       = io(0x00)
	kvmCreateVM            = io(0x01)
	kvmGetMSRIndexList     = iowr(0x02, unsafe.Sizeof(msrListHeader{}))
	kvmCheckExtension      = io(0x03)
	kvmGetVCPUMmapSize     = io(0x04)
	kvmGetSupportedCPUID   = iowr(0x05, unsafe.Sizeof(cpuid2Header{}))
	kvmCreateVCPU          = io(0x41)
	kvmGetDirtyLog         = iow(0x42, unsafe.Sizeof(dirtyLog{}))
	kvmSetUserMemoryRegion = iow(0x46, unsafe.Sizeof(UserspaceMemoryRegion{}))
	kvmSetTSSAddr          = io(0x47)
	kvmSetIdentityMapAddr  = iow(0x48, 8)
	kvmCreateIRQChip       = io(0x60)
	kvmIRQLine             = iow(0x61, unsafe.Sizeof(IRQLevel{}))
	kvmGetIRQChip          = iowr(0x62, unsafe.Sizeof(IRQChip{}))
	kvmSetIRQChip          = ior(0x63, unsafe.Sizeof(IRQChip{}))
	kvmSetGSIRouting       = iow(0x6a, unsafe.Sizeof(irqRoutingHeader{}))
	kvmIRQFD               = iow(0x76, unsafe.Sizeof(IRQFD{}))
	kvmCreatePIT2          = iow(0x77, unsafe.Sizeof(PITConfig{}))
	kvmIOEventFD           = iow(0x79, unsafe.Sizeof(IOEventFD{}))
	kvmSetClock            = iow(0x7b, unsafe.Sizeof(ClockData{}))
	kvmGetClock            = ior(0x7c, unsafe.Sizeof(ClockData{}))
	kvmGetPIT2             = ior(0x9f, unsafe.Sizeof(PITState2{}))
	kvmSetPIT2             = iow(0xa0, unsafe.Sizeof(PITState2{}))
	kvmEnableCap           = iow(0xa3, unsafe.Sizeof(EnableCap{}))
	kvmSignalMSI           = iow(0xa5, unsafe.Sizeof(MSI{}))

	kvmRun           = io(0x80)
	kvmGetRegs       = ior(0x81, unsafe.Sizeof(Regs{}))
	kvmSetRegs       = iow(0x82, unsafe.Sizeof(Regs{}))
	kvmGetSregs      = ior(0x83, unsafe.Sizeof(Sregs{}))
	kvmSetSregs      = iow(0x84, unsafe.Sizeof(Sregs{}))
	kvmGetMSRs       = iowr(0x88, unsafe.Sizeof(msrsHeader{}))
	kvmSetMSRs       = iow(0x89, unsafe.Sizeof(msrsHeader{}))
	kvmGetFPU        = ior(0x8c, unsafe.Sizeof(FPU{}))
	kvmSetFPU        = iow(0x8d, unsafe.Sizeof(FPU{}))
	kvmGetLAPIC      = ior(0x8e, unsafe.Sizeof(LAPICState{}))
	kvmSetLAPIC      = iow(0x8f, unsafe.Sizeof(LAPICState{}))
	kvmSetCPUID2     = iow(0x90, unsafe.Sizeof(cpuid2Header{}))
	kvmGetCPUID2     = iowr(0x91, unsafe.Sizeof(cpuid2Header{}))
	kvmGetMPState    = ior(0x98, unsafe.Sizeof(MPState{}))
	kvmSetMPState    = iow(0x99, unsafe.Sizeof(MPState{}))
	kvmGetVCPUEvents = ior(0x9f, unsafe.Sizeof(VCPUEvents{}))
	kvmSetVCPUEvents = iow(0xa0, unsafe.Sizeof(VCPUEvents{}))
	kvmGetDebugRegs  = ior(0xa1, unsafe.Sizeof(DebugRegs{}))
	kvmSetDebugRegs  = iow(0xa2, unsafe.Sizeof(DebugRegs{}))
	kvmSetTSCKHz     = io(0xa2)
	kvmGetTSCKHz     = io(0xa3)
	kvmGetXSave      = ior(0xa4, unsafe.Sizeof(XSave{}))
	kvmSetXSave      = iow(0xa5, unsafe.Sizeof(XSave{}))
	kvmGetXCRs       = ior(0xa6, unsafe.Sizeof(XCRs{}))
	kvmSetXCRs       = iow(0xa7, unsafe.Sizeof(XCRs{}))
	kvmKVMClockCtrl  = io(0xad)
	kvmGetXSave2     = ior(0xcf, unsafe.Sizeof(XSave{}))
)
