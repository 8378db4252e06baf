package snapshot

// The vCPU and VM state a snapshot holds, in the state payload. Each struct
// mirrors a KVM struct (named beside it) field for field, without its
// padding; the machine converts between the two. The json names are the
// format's: they are the KVM structs' Go field names as version 1 first
// wrote them, and changing one is a Version bump.

// VCPU is one vCPU's state, in the order KVM gets and sets it.
type VCPU struct {
	ID        int          `json:"ID"`
	CPUID     []CPUIDEntry `json:"CPUID"`
	MPState   MPState      `json:"MPState"`
	Regs      Regs         `json:"Regs"`
	Sregs     Sregs        `json:"Sregs"`
	XSave     []uint32     `json:"XSave"` // KVM_GET_XSAVE2's size, or KVM_GET_XSAVE's 1024 words
	XCRs      XCRs         `json:"XCRs"`
	DebugRegs DebugRegs    `json:"DebugRegs"`
	LAPIC     LAPIC        `json:"LAPIC"`
	MSRs      []MSR        `json:"MSRs"` // TSC_DEADLINE after TSC
	Events    VCPUEvents   `json:"Events"`
	TSCKHz    uint32       `json:"TSCKHz"` // 0: unknown
}

// Bounds a decoded VCPU must keep (DecodePayload checks them).
const (
	MaxVCPUs        = 254
	MaxCPUIDEntries = 256 // KVM_MAX_CPUID_ENTRIES
	MaxMSRs         = 4096
	minXSaveWords   = 1024 // struct kvm_xsave
	maxXSaveWords   = 1 << 18
)

// CPUIDEntry is struct kvm_cpuid_entry2.
type CPUIDEntry struct {
	Function uint32 `json:"Function"`
	Index    uint32 `json:"Index"`
	Flags    uint32 `json:"Flags"`
	EAX      uint32 `json:"EAX"`
	EBX      uint32 `json:"EBX"`
	ECX      uint32 `json:"ECX"`
	EDX      uint32 `json:"EDX"`
}

// MPState is struct kvm_mp_state.
type MPState struct {
	MPState uint32 `json:"MPState"`
}

// Regs is struct kvm_regs.
type Regs struct {
	RAX    uint64 `json:"RAX"`
	RBX    uint64 `json:"RBX"`
	RCX    uint64 `json:"RCX"`
	RDX    uint64 `json:"RDX"`
	RSI    uint64 `json:"RSI"`
	RDI    uint64 `json:"RDI"`
	RSP    uint64 `json:"RSP"`
	RBP    uint64 `json:"RBP"`
	R8     uint64 `json:"R8"`
	R9     uint64 `json:"R9"`
	R10    uint64 `json:"R10"`
	R11    uint64 `json:"R11"`
	R12    uint64 `json:"R12"`
	R13    uint64 `json:"R13"`
	R14    uint64 `json:"R14"`
	R15    uint64 `json:"R15"`
	RIP    uint64 `json:"RIP"`
	RFLAGS uint64 `json:"RFLAGS"`
}

// Segment is struct kvm_segment.
type Segment struct {
	Base     uint64 `json:"Base"`
	Limit    uint32 `json:"Limit"`
	Selector uint16 `json:"Selector"`
	Type     uint8  `json:"Type"`
	Present  uint8  `json:"Present"`
	DPL      uint8  `json:"DPL"`
	DB       uint8  `json:"DB"`
	S        uint8  `json:"S"`
	L        uint8  `json:"L"`
	G        uint8  `json:"G"`
	AVL      uint8  `json:"AVL"`
	Unusable uint8  `json:"Unusable"`
}

// DTable is struct kvm_dtable.
type DTable struct {
	Base  uint64 `json:"Base"`
	Limit uint16 `json:"Limit"`
}

// Sregs is struct kvm_sregs.
type Sregs struct {
	CS              Segment   `json:"CS"`
	DS              Segment   `json:"DS"`
	ES              Segment   `json:"ES"`
	FS              Segment   `json:"FS"`
	GS              Segment   `json:"GS"`
	SS              Segment   `json:"SS"`
	TR              Segment   `json:"TR"`
	LDT             Segment   `json:"LDT"`
	GDT             DTable    `json:"GDT"`
	IDT             DTable    `json:"IDT"`
	CR0             uint64    `json:"CR0"`
	CR2             uint64    `json:"CR2"`
	CR3             uint64    `json:"CR3"`
	CR4             uint64    `json:"CR4"`
	CR8             uint64    `json:"CR8"`
	EFER            uint64    `json:"EFER"`
	APICBase        uint64    `json:"APICBase"`
	InterruptBitmap [4]uint64 `json:"InterruptBitmap"`
}

// XCR is struct kvm_xcr.
type XCR struct {
	XCR      uint32 `json:"XCR"`
	Reserved uint32 `json:"Reserved"`
	Value    uint64 `json:"Value"`
}

// XCRs is struct kvm_xcrs.
type XCRs struct {
	NrXCRs  uint32     `json:"NrXCRs"`
	Flags   uint32     `json:"Flags"`
	XCRs    [16]XCR    `json:"XCRs"` // KVM_MAX_XCRS
	Padding [16]uint64 `json:"Padding"`
}

// DebugRegs is struct kvm_debugregs.
type DebugRegs struct {
	DB       [4]uint64 `json:"DB"`
	DR6      uint64    `json:"DR6"`
	DR7      uint64    `json:"DR7"`
	Flags    uint64    `json:"Flags"`
	Reserved [9]uint64 `json:"Reserved"`
}

// LAPIC is struct kvm_lapic_state (a JSON array of 1024 numbers, not base64).
type LAPIC struct {
	Regs [0x400]byte `json:"Regs"`
}

// MSR is struct kvm_msr_entry.
type MSR struct {
	Index    uint32 `json:"Index"`
	Reserved uint32 `json:"Reserved"`
	Data     uint64 `json:"Data"`
}

// VCPUEvents is struct kvm_vcpu_events.
type VCPUEvents struct {
	Exception struct {
		Injected     uint8  `json:"Injected"`
		Nr           uint8  `json:"Nr"`
		HasErrorCode uint8  `json:"HasErrorCode"`
		Pending      uint8  `json:"Pending"`
		ErrorCode    uint32 `json:"ErrorCode"`
	} `json:"Exception"`
	Interrupt struct {
		Injected uint8 `json:"Injected"`
		Nr       uint8 `json:"Nr"`
		Soft     uint8 `json:"Soft"`
		Shadow   uint8 `json:"Shadow"`
	} `json:"Interrupt"`
	NMI struct {
		Injected uint8 `json:"Injected"`
		Pending  uint8 `json:"Pending"`
		Masked   uint8 `json:"Masked"`
		Pad      uint8 `json:"Pad"`
	} `json:"NMI"`
	SIPIVector uint32 `json:"SIPIVector"`
	Flags      uint32 `json:"Flags"`
	SMI        struct {
		SMM          uint8 `json:"SMM"`
		Pending      uint8 `json:"Pending"`
		SMMInsideNMI uint8 `json:"SMMInsideNMI"`
		LatchedInit  uint8 `json:"LatchedInit"`
	} `json:"SMI"`
	TripleFaultPending  uint8     `json:"TripleFaultPending"`
	Reserved            [26]uint8 `json:"Reserved"`
	ExceptionHasPayload uint8     `json:"ExceptionHasPayload"`
	ExceptionPayload    uint64    `json:"ExceptionPayload"`
}

// IRQChip is struct kvm_irqchip: a PIC or the IOAPIC, the chip union kept
// as raw bytes (a JSON array of 512 numbers).
type IRQChip struct {
	ChipID uint32    `json:"ChipID"`
	Chip   [512]byte `json:"Chip"`
}

// PITChannel is struct kvm_pit_channel_state.
type PITChannel struct {
	Count         uint32 `json:"Count"`
	LatchedCount  uint16 `json:"LatchedCount"`
	CountLatched  uint8  `json:"CountLatched"`
	StatusLatched uint8  `json:"StatusLatched"`
	Status        uint8  `json:"Status"`
	ReadState     uint8  `json:"ReadState"`
	WriteState    uint8  `json:"WriteState"`
	WriteLatch    uint8  `json:"WriteLatch"`
	RWMode        uint8  `json:"RWMode"`
	Mode          uint8  `json:"Mode"`
	BCD           uint8  `json:"BCD"`
	Gate          uint8  `json:"Gate"`
	CountLoadTime int64  `json:"CountLoadTime"`
}

// PIT is struct kvm_pit_state2.
type PIT struct {
	Channels [3]PITChannel `json:"Channels"`
	Flags    uint32        `json:"Flags"`
	Reserved [9]uint32     `json:"Reserved"`
}

// Clock is struct kvm_clock_data (restore sets only Clock).
type Clock struct {
	Clock    uint64 `json:"Clock"`
	Flags    uint32 `json:"Flags"`
	Realtime uint64 `json:"Realtime"`
	HostTSC  uint64 `json:"HostTSC"`
}
