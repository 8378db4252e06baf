package kvmtest

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/cube-runtime/cube/hypervisor/kvm"
)

// GDT selectors written by WriteGDT.
const (
	CodeSelector = 0x08
	DataSelector = 0x10
	gdtEntries   = 3
)

// WriteGDT writes a null descriptor, a 64-bit code descriptor and a data
// descriptor (flat) into b (at least 24 bytes). KVM takes segment state
// from SREGS, but a guest reloading a selector reads this table.
func WriteGDT(b []byte) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], 0)
	le.PutUint64(b[8:], 0x00af9b000000ffff)  // code: P, DPL0, S, type 0xb, L, G
	le.PutUint64(b[16:], 0x00cf93000000ffff) // data: P, DPL0, S, type 0x3, D/B, G
}

// LongMode puts cpu straight into 64-bit mode with paging rooted at pml4
// and the flat segments of WriteGDT(gdt).
func LongMode(cpu *kvm.VCPU, pml4, gdt uint64) error {
	s, err := cpu.GetSregs()
	if err != nil {
		return fmt.Errorf("long mode: %w", err)
	}
	code := kvm.Segment{Base: 0, Limit: 0xffffffff, Selector: CodeSelector, Type: 0xb,
		Present: 1, DPL: 0, DB: 0, S: 1, L: 1, G: 1}
	data := kvm.Segment{Base: 0, Limit: 0xffffffff, Selector: DataSelector, Type: 0x3,
		Present: 1, DPL: 0, DB: 1, S: 1, L: 0, G: 1}
	s.CS = code
	s.DS, s.ES, s.FS, s.GS, s.SS = data, data, data, data, data
	s.GDT = kvm.DTable{Base: gdt, Limit: gdtEntries*8 - 1}
	const (
		cr0PE   = 1 << 0
		cr0MP   = 1 << 1
		cr0ET   = 1 << 4
		cr0NE   = 1 << 5
		cr0WP   = 1 << 16
		cr0AM   = 1 << 18
		cr0PG   = 1 << 31
		cr4PAE  = 1 << 5
		eferLME = 1 << 8
		eferLMA = 1 << 10
	)
	s.CR3 = pml4
	s.CR4 = cr4PAE
	s.CR0 = cr0PE | cr0MP | cr0ET | cr0NE | cr0WP | cr0AM | cr0PG
	s.EFER = eferLME | eferLMA
	if err := cpu.SetSregs(s); err != nil {
		return fmt.Errorf("long mode: %w", err)
	}
	return nil
}

var le = binary.LittleEndian

func sliceAddr(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }
