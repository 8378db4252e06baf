package kvm

import (
	"encoding/binary"
	"fmt"
)

// ExitReason is kvm_run.exit_reason.
type ExitReason uint32

var exitNames = map[ExitReason]string{
	ExitUnknown: "UNKNOWN", ExitException: "EXCEPTION", ExitIO: "IO", ExitHypercall: "HYPERCALL",
	ExitDebug: "DEBUG", ExitHLT: "HLT", ExitMMIO: "MMIO", ExitIRQWindowOpen: "IRQ_WINDOW_OPEN",
	ExitShutdown: "SHUTDOWN", ExitFailEntry: "FAIL_ENTRY", ExitIntr: "INTR", ExitSetTPR: "SET_TPR",
	ExitTPRAccess: "TPR_ACCESS", ExitNMI: "NMI", ExitInternalError: "INTERNAL_ERROR",
	ExitSystemEvent: "SYSTEM_EVENT", ExitIOAPICEOI: "IOAPIC_EOI",
}

func (r ExitReason) String() string {
	if n, ok := exitNames[r]; ok {
		return n
	}
	return fmt.Sprintf("EXIT_%d", uint32(r))
}

// RunData is a vCPU's mapped struct kvm_run. All accessors decode with
// explicit offsets and bounds checks rather than casting the page to a Go
// struct, because the kernel fills some fields (io.data_offset) that point
// elsewhere in the region.
type RunData []byte

var le = binary.LittleEndian

// ExitReason reads kvm_run.exit_reason.
func (r RunData) ExitReason() ExitReason {
	return ExitReason(le.Uint32(r[runExitReason:]))
}

// IOExit describes a KVM_EXIT_IO. Data aliases the kvm_run region: for IN
// exits the device fills it and the kernel hands it to the guest on the
// next KVM_RUN. It holds Size*Count bytes (string I/O repeats Count times).
type IOExit struct {
	Direction uint8
	Size      uint8
	Port      uint16
	Count     uint32
	Data      []byte
}

// IO decodes kvm_run.io. It fails if the exit is not IO or the kernel's
// offsets fall outside the region.
func (r RunData) IO() (IOExit, error) {
	if rs := r.ExitReason(); rs != ExitIO {
		return IOExit{}, fmt.Errorf("kvm: exit is %v, not IO", rs)
	}
	u := r[runExitUnion:]
	e := IOExit{
		Direction: u[0],
		Size:      u[1],
		Port:      le.Uint16(u[2:]),
		Count:     le.Uint32(u[4:]),
	}
	off := le.Uint64(u[8:])
	switch e.Size {
	case 1, 2, 4:
	default:
		return IOExit{}, fmt.Errorf("kvm: io exit port %#x: bad size %d", e.Port, e.Size)
	}
	n := uint64(e.Size) * uint64(e.Count)
	if e.Count == 0 || off > uint64(len(r)) || n > uint64(len(r))-off {
		return IOExit{}, fmt.Errorf("kvm: io exit port %#x: data [%#x,+%d) outside kvm_run (%d bytes)",
			e.Port, off, n, len(r))
	}
	e.Data = r[off : off+n : off+n]
	return e, nil
}

// MMIOExit describes a KVM_EXIT_MMIO. Data aliases kvm_run.mmio.data and
// has Len bytes; for reads the device fills it.
type MMIOExit struct {
	Addr    uint64
	IsWrite bool
	Data    []byte
}

// MMIO decodes kvm_run.mmio.
func (r RunData) MMIO() (MMIOExit, error) {
	if rs := r.ExitReason(); rs != ExitMMIO {
		return MMIOExit{}, fmt.Errorf("kvm: exit is %v, not MMIO", rs)
	}
	u := r[runExitUnion:]
	addr := le.Uint64(u[0:])
	n := le.Uint32(u[16:])
	if n == 0 || n > 8 {
		return MMIOExit{}, fmt.Errorf("kvm: mmio exit at %#x: bad length %d", addr, n)
	}
	return MMIOExit{Addr: addr, IsWrite: u[20] != 0, Data: u[8 : 8+n : 8+n]}, nil
}

// FailEntry decodes kvm_run.fail_entry.
func (r RunData) FailEntry() (reason uint64, cpu uint32) {
	u := r[runExitUnion:]
	return le.Uint64(u[0:]), le.Uint32(u[8:])
}

// InternalError decodes kvm_run.internal: the suberror and up to 16 data words.
func (r RunData) InternalError() (suberror uint32, data []uint64) {
	u := r[runExitUnion:]
	suberror = le.Uint32(u[0:])
	n := le.Uint32(u[4:])
	if n > 16 {
		n = 16
	}
	for i := uint32(0); i < n; i++ {
		data = append(data, le.Uint64(u[8+8*i:]))
	}
	return suberror, data
}

// SystemEvent decodes kvm_run.system_event: its type and data words.
func (r RunData) SystemEvent() (typ uint32, data []uint64) {
	u := r[runExitUnion:]
	typ = le.Uint32(u[0:])
	n := le.Uint32(u[4:])
	if n > 16 {
		n = 16
	}
	for i := uint32(0); i < n; i++ {
		data = append(data, le.Uint64(u[8+8*i:]))
	}
	return typ, data
}

// ExitError turns the exits no VMM can continue from (FAIL_ENTRY,
// INTERNAL_ERROR, SHUTDOWN, UNKNOWN, EXCEPTION) into a descriptive error;
// other exits give nil.
func (r RunData) ExitError() error {
	switch rs := r.ExitReason(); rs {
	case ExitFailEntry:
		reason, cpu := r.FailEntry()
		return fmt.Errorf("kvm: FAIL_ENTRY: hardware entry failure reason %#x on cpu %d", reason, cpu)
	case ExitInternalError:
		sub, data := r.InternalError()
		return fmt.Errorf("kvm: INTERNAL_ERROR: suberror %d (%s), data %#x", sub, internalSuberror(sub), data)
	case ExitShutdown:
		return fmt.Errorf("kvm: SHUTDOWN (guest triple fault)")
	case ExitUnknown:
		return fmt.Errorf("kvm: UNKNOWN exit: hardware exit reason %#x", le.Uint64(r[runExitUnion:]))
	case ExitException:
		u := r[runExitUnion:]
		return fmt.Errorf("kvm: EXCEPTION exit: vector %d error code %#x", le.Uint32(u[0:]), le.Uint32(u[4:]))
	}
	return nil
}

func internalSuberror(s uint32) string {
	switch s {
	case 1:
		return "emulation failure"
	case 2:
		return "simultaneous exceptions"
	case 3:
		return "delivery event"
	case 4:
		return "unexpected exit reason"
	}
	return "unknown"
}
