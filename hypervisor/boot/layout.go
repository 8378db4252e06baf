package boot

import (
	"fmt"
	"io"

	"github.com/cube-runtime/cube/hypervisor/memory"
)

// Fixed guest-physical layout below 1 MiB (the kernel goes at 1 MiB).
const (
	GDTAddr      = 0x500
	ZeroPageAddr = 0x7000
	PML4Addr     = 0x9000
	PDPTAddr     = 0xa000
	PDAddr       = 0xb000
	CmdlineAddr  = 0x20000
	CmdlineMax   = 0x10000
	EBDAStart    = 0x9fc00
	// ACPIAddr..ACPIEnd holds the RSDP and ACPI tables (below
	// VMGenIDAddr), the VM generation id and the reset stub; the e820 map
	// marks it reserved so the guest keeps it.
	ACPIAddr = 0xe0000
	ACPIEnd  = 0x100000
	// VMGenIDAddr is the 16-byte VM generation id the DSDT's VGEN.ADDR
	// names (hypervisor/devices/vmgenid), on a page of its own.
	VMGenIDAddr = 0xfe000
	// IdentityMapSize is how much the boot page tables map (2 MiB pages).
	IdentityMapSize = 1 << 30
)

// Image is everything Setup writes into guest memory.
type Image struct {
	Kernel  *Kernel
	Cmdline string
	Initrd  []byte
	// RSDPAddr is passed in boot_params (0 if there are no ACPI tables).
	RSDPAddr uint64
}

// Loaded says where Setup put things.
type Loaded struct {
	Entry      uint64
	ZeroPage   uint64
	InitrdAddr uint64
	E820       []E820Entry
}

// E820 derives the memory map from the RAM ranges.
func E820(ram []memory.Range) ([]E820Entry, error) {
	if len(ram) == 0 || ram[0].GPA != 0 || ram[0].Size < 2*HighLoadAddr {
		return nil, fmt.Errorf("e820: need RAM from 0 of at least 2 MiB, got %v", ram)
	}
	out := []E820Entry{
		{0, EBDAStart, E820RAM},
		{EBDAStart, 0xa0000 - EBDAStart, E820Reserved},
		{ACPIAddr, ACPIEnd - ACPIAddr, E820Reserved},
		{HighLoadAddr, ram[0].Size - HighLoadAddr, E820RAM},
	}
	for _, r := range ram[1:] {
		out = append(out, E820Entry{r.GPA, r.Size, E820RAM})
	}
	if len(out) > MaxE820 {
		return nil, fmt.Errorf("e820: %d entries exceed %d", len(out), MaxE820)
	}
	return out, nil
}

// Setup writes the kernel, command line, initrd, zero page, boot page
// tables and boot GDT into guest memory.
func Setup(mem io.WriterAt, ram []memory.Range, img Image) (*Loaded, error) {
	e820, err := E820(ram)
	if err != nil {
		return nil, err
	}
	k := img.Kernel
	lowEnd := ram[0].End() // RAM below the MMIO hole
	kernelEnd := uint64(HighLoadAddr)
	for _, s := range k.Segments {
		end := s.GPA + uint64(len(s.Data))
		if s.GPA < HighLoadAddr || end > lowEnd || end < s.GPA {
			return nil, fmt.Errorf("boot: kernel segment [%#x,%#x) outside RAM [1 MiB, %#x)", s.GPA, end, lowEnd)
		}
		if _, err := mem.WriteAt(s.Data, int64(s.GPA)); err != nil {
			return nil, fmt.Errorf("boot: write kernel at %#x: %w", s.GPA, err)
		}
		kernelEnd = max(kernelEnd, end)
	}
	// A bzImage decompresses in place and needs init_size bytes from its
	// load address; an ELF needs its .bss. The initrd must stay clear.
	kernelEnd = max(kernelEnd, k.End)

	if len(img.Cmdline)+1 > CmdlineMax {
		return nil, fmt.Errorf("boot: command line of %d bytes is too long", len(img.Cmdline))
	}
	cmd := append([]byte(img.Cmdline), 0)
	if _, err := mem.WriteAt(cmd, CmdlineAddr); err != nil {
		return nil, fmt.Errorf("boot: write command line: %w", err)
	}

	var initrdAddr uint64
	if len(img.Initrd) > 0 {
		top := lowEnd
		if max := uint64(k.InitrdAddrMax) + 1; k.InitrdAddrMax != 0 && max < top {
			top = max
		}
		size := uint64(len(img.Initrd))
		if size > top {
			return nil, fmt.Errorf("boot: initrd of %d bytes does not fit below %#x", size, top)
		}
		initrdAddr = (top - size) &^ (memory.PageSize - 1)
		if initrdAddr < kernelEnd {
			return nil, fmt.Errorf("boot: initrd of %d bytes does not fit between the kernel (ends %#x) and %#x; add memory",
				size, kernelEnd, top)
		}
		if _, err := mem.WriteAt(img.Initrd, int64(initrdAddr)); err != nil {
			return nil, fmt.Errorf("boot: write initrd: %w", err)
		}
	}

	zp, err := ZeroPage(Params{
		Kernel: k, CmdlineAddr: CmdlineAddr, CmdlineLen: len(cmd),
		InitrdAddr: initrdAddr, InitrdSize: uint64(len(img.Initrd)),
		E820: e820, RSDPAddr: img.RSDPAddr,
	})
	if err != nil {
		return nil, err
	}
	if _, err := mem.WriteAt(zp, ZeroPageAddr); err != nil {
		return nil, fmt.Errorf("boot: write zero page: %w", err)
	}
	if _, err := mem.WriteAt(PageTables(), PML4Addr); err != nil {
		return nil, fmt.Errorf("boot: write page tables: %w", err)
	}
	if _, err := mem.WriteAt(GDT(), GDTAddr); err != nil {
		return nil, fmt.Errorf("boot: write gdt: %w", err)
	}
	return &Loaded{Entry: k.Entry, ZeroPage: ZeroPageAddr, InitrdAddr: initrdAddr, E820: e820}, nil
}

// PageTables returns PML4, PDPT and one PD (contiguous from PML4Addr)
// identity-mapping IdentityMapSize with 2 MiB pages.
func PageTables() []byte {
	const (
		present = 1 << 0
		rw      = 1 << 1
		ps      = 1 << 7
	)
	b := make([]byte, 3*4096)
	le.PutUint64(b[0:], PDPTAddr|present|rw)
	le.PutUint64(b[4096:], PDAddr|present|rw)
	for i := uint64(0); i < IdentityMapSize>>21; i++ {
		le.PutUint64(b[8192+8*i:], i<<21|present|rw|ps)
	}
	return b
}

// Boot GDT selectors, as the 64-bit boot protocol names them.
const (
	BootCS = 0x10
	BootDS = 0x18
	BootTR = 0x20
)

// GDT returns the boot GDT: two null entries, __BOOT_CS, __BOOT_DS and a
// 16-byte TSS descriptor (VM entry on Intel insists on a usable TR).
func GDT() []byte {
	b := make([]byte, 8*6)
	le.PutUint64(b[BootCS:], 0x00af9b000000ffff) // 64-bit code, DPL0, G
	le.PutUint64(b[BootDS:], 0x00cf93000000ffff) // data, DPL0, D/B, G
	le.PutUint64(b[BootTR:], 0x00008b0000000067) // busy 64-bit TSS, base 0, limit 0x67
	return b
}

// ResetVector is where an x86 CPU starts after reset (F000:FFF0).
const ResetVector = 0xffff0

// ResetStub is real-mode code for the reset vector that writes value to
// port and halts. There is no firmware to reboot into, so a guest that
// lands here (Linux's last-resort "BIOS" reboot, which it picks first on
// hardware-reduced ACPI where it expects EFI; or a CPU reset after a
// triple fault) asks the VMM to reboot through the ACPI reset register.
func ResetStub(port uint16, value byte) []byte {
	return []byte{
		0xba, byte(port), byte(port >> 8), // mov dx, port
		0xb0, value, // mov al, value
		0xee,       // out dx, al
		0xf4,       // hlt
		0xeb, 0xfd, // jmp hlt
	}
}
