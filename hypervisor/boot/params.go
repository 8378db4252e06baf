package boot

import (
	"fmt"
)

// E820 entry types.
const (
	E820RAM      = 1
	E820Reserved = 2
	E820ACPI     = 3
)

// E820Entry is one entry of the BIOS memory map.
type E820Entry struct {
	Addr, Size uint64
	Type       uint32
}

// Params is what goes into the zero page.
type Params struct {
	Kernel      *Kernel
	CmdlineAddr uint64
	CmdlineLen  int // bytes including the terminating NUL
	InitrdAddr  uint64
	InitrdSize  uint64
	E820        []E820Entry
	RSDPAddr    uint64 // 0: let the guest scan for it
}

// ZeroPage builds struct boot_params.
func ZeroPage(p Params) ([]byte, error) {
	if len(p.E820) == 0 || len(p.E820) > MaxE820 {
		return nil, fmt.Errorf("boot params: %d e820 entries (need 1..%d)", len(p.E820), MaxE820)
	}
	if p.Kernel == nil {
		return nil, fmt.Errorf("boot params: no kernel")
	}
	zp := make([]byte, ZeroPageSize)
	if p.Kernel.Setup != nil {
		copy(zp[offSetupSects:], p.Kernel.Setup)
	} else {
		// vmlinux: synthesize the fields the kernel checks.
		le.PutUint16(zp[offBootFlag:], bootFlag)
		le.PutUint32(zp[offHeaderMagic:], headerMagic)
		le.PutUint16(zp[offVersion:], p.Kernel.Version)
		le.PutUint32(zp[offKernelAlign:], 0x1000000)
		zp[offLoadFlags] = loadedHigh
	}
	// 0xff: "undefined" boot loader, as the protocol asks of loaders
	// without an assigned id.
	zp[offTypeOfLoader] = 0xff
	zp[offLoadFlags] |= canUseHeap
	le.PutUint16(zp[offHeapEndPtr:], 0xfe00)
	if p.CmdlineAddr > 0xffffffff || p.InitrdAddr+p.InitrdSize > 1<<32 || p.InitrdSize > 0xffffffff {
		// ext_* fields would allow more, but our layout never needs it;
		// refuse rather than truncate.
		return nil, fmt.Errorf("boot params: cmdline %#x or initrd [%#x,+%#x) above 4 GiB", p.CmdlineAddr, p.InitrdAddr, p.InitrdSize)
	}
	if max := p.Kernel.CmdlineSize; max != 0 && uint32(p.CmdlineLen) > max+1 {
		return nil, fmt.Errorf("boot params: command line of %d bytes exceeds the kernel's limit of %d", p.CmdlineLen-1, max)
	}
	le.PutUint32(zp[offCmdLinePtr:], uint32(p.CmdlineAddr))
	le.PutUint32(zp[offExtCmdLinePtr:], 0)
	le.PutUint32(zp[offRamdiskImage:], uint32(p.InitrdAddr))
	le.PutUint32(zp[offRamdiskSize:], uint32(p.InitrdSize))
	le.PutUint32(zp[offExtRamdiskImg:], 0)
	le.PutUint32(zp[offExtRamdiskSize:], 0)
	le.PutUint64(zp[offACPIRSDPAddr:], p.RSDPAddr)
	zp[offE820Entries] = byte(len(p.E820))
	for i, e := range p.E820 {
		o := offE820Table + 20*i
		le.PutUint64(zp[o:], e.Addr)
		le.PutUint64(zp[o+8:], e.Size)
		le.PutUint32(zp[o+16:], e.Type)
	}
	return zp, nil
}
