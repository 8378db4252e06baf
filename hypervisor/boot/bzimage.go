// Package boot implements the Linux x86 64-bit boot protocol: loading a
// bzImage (or an ELF vmlinux), building the zero page (struct boot_params)
// with the e820 map, command line and initrd, and the initial vCPU state
// the protocol requires (64-bit mode, identity-mapped, flat segments).
//
// Reference: Documentation/arch/x86/boot.rst ("64-bit BOOT PROTOCOL").
package boot

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

var le = binary.LittleEndian

// Offsets into boot_params / the bzImage's first sector (setup header
// starts at 0x1f1 in both).
const (
	offACPIRSDPAddr   = 0x070
	offExtRamdiskImg  = 0x0c0
	offExtRamdiskSize = 0x0c4
	offExtCmdLinePtr  = 0x0c8
	offE820Entries    = 0x1e8
	offSetupSects     = 0x1f1
	offBootFlag       = 0x1fe
	offJump           = 0x200
	offHeaderMagic    = 0x202
	offVersion        = 0x206
	offTypeOfLoader   = 0x210
	offLoadFlags      = 0x211
	offCode32Start    = 0x214
	offRamdiskImage   = 0x218
	offRamdiskSize    = 0x21c
	offHeapEndPtr     = 0x224
	offCmdLinePtr     = 0x228
	offInitrdAddrMax  = 0x22c
	offKernelAlign    = 0x230
	offRelocatable    = 0x234
	offXLoadFlags     = 0x236
	offCmdlineSize    = 0x238
	offPrefAddress    = 0x258
	offInitSize       = 0x260
	offE820Table      = 0x2d0

	headerMagic  = 0x53726448 // "HdrS"
	bootFlag     = 0xaa55
	loadedHigh   = 1 << 0
	canUseHeap   = 1 << 7
	xlfKernel64  = 1 << 0
	minVersion   = 0x020c // 2.12: xloadflags, 64-bit entry advertised
	entry64Delta = 0x200  // startup_64 is 0x200 past the 32-bit entry

	// ZeroPageSize is sizeof(struct boot_params).
	ZeroPageSize = 4096
	// MaxE820 is the number of e820 entries boot_params holds.
	MaxE820 = 128
)

// Kernel is a parsed kernel image ready to be copied into guest memory.
type Kernel struct {
	// Segments to copy: guest-physical address and bytes.
	Segments []Segment
	// Entry is the 64-bit entry point (guest-physical).
	Entry uint64
	// Setup is the setup header bytes [0x1f1, end) from a bzImage, copied
	// into the zero page; nil for vmlinux.
	Setup []byte
	// Limits from the header (defaults for vmlinux).
	InitrdAddrMax uint32
	CmdlineSize   uint32
	InitSize      uint64
	Version       uint16
	// End is the first guest-physical address the kernel does not need
	// while it boots (load address + init_size, or the ELF's highest
	// segment end including .bss); the initrd goes above it.
	End uint64
}

// Segment is a block of kernel bytes at a guest-physical address.
type Segment struct {
	GPA  uint64
	Data []byte
}

// HighLoadAddr is where the protected-mode kernel of a bzImage is loaded.
const HighLoadAddr = 0x100000

// ErrNotBzImage means the data has no Linux setup header.
var ErrNotBzImage = errors.New("not a bzImage (no HdrS setup header)")

// LoadKernel accepts a bzImage or an ELF vmlinux.
func LoadKernel(img []byte) (*Kernel, error) {
	if len(img) >= 4 && bytes.Equal(img[:4], []byte(elf.ELFMAG)) {
		return ParseVmlinux(img)
	}
	return ParseBzImage(img)
}

// ParseBzImage validates a bzImage and splits it into its setup header and
// protected-mode payload.
func ParseBzImage(img []byte) (*Kernel, error) {
	if len(img) < 0x268 {
		return nil, fmt.Errorf("kernel image of %d bytes: %w", len(img), ErrNotBzImage)
	}
	if le.Uint32(img[offHeaderMagic:]) != headerMagic || le.Uint16(img[offBootFlag:]) != bootFlag {
		return nil, ErrNotBzImage
	}
	v := le.Uint16(img[offVersion:])
	if v < minVersion {
		return nil, fmt.Errorf("boot protocol %d.%02d too old: need 2.12 or later", v>>8, v&0xff)
	}
	if le.Uint16(img[offXLoadFlags:])&xlfKernel64 == 0 {
		return nil, fmt.Errorf("bzImage has no 64-bit entry point (XLF_KERNEL_64 clear)")
	}
	if img[offLoadFlags]&loadedHigh == 0 {
		return nil, fmt.Errorf("bzImage is not a high-loading kernel (zImage?)")
	}
	setupSects := int(img[offSetupSects])
	if setupSects == 0 {
		setupSects = 4
	}
	payload := (setupSects + 1) * 512
	if payload >= len(img) {
		return nil, fmt.Errorf("bzImage truncated: setup of %d bytes, file of %d", payload, len(img))
	}
	// The setup header's length is given by the jump at 0x200.
	hdrEnd := 0x202 + int(img[0x201])
	if img[offJump] != 0xeb || hdrEnd > payload || hdrEnd < offInitSize+4 {
		return nil, fmt.Errorf("bzImage setup header end %#x invalid", hdrEnd)
	}
	return &Kernel{
		Segments:      []Segment{{GPA: HighLoadAddr, Data: img[payload:]}},
		Entry:         HighLoadAddr + entry64Delta,
		Setup:         append([]byte(nil), img[offSetupSects:hdrEnd]...),
		InitrdAddrMax: le.Uint32(img[offInitrdAddrMax:]),
		CmdlineSize:   le.Uint32(img[offCmdlineSize:]),
		InitSize:      uint64(le.Uint32(img[offInitSize:])),
		Version:       v,
		End:           HighLoadAddr + uint64(le.Uint32(img[offInitSize:])),
	}, nil
}

// ParseVmlinux loads the PT_LOAD segments of an x86-64 ELF vmlinux at
// their physical addresses; its e_entry is startup_64's physical address.
func ParseVmlinux(img []byte) (*Kernel, error) {
	f, err := elf.NewFile(bytes.NewReader(img))
	if err != nil {
		return nil, fmt.Errorf("vmlinux: %w", err)
	}
	if f.Class != elf.ELFCLASS64 || f.Machine != elf.EM_X86_64 {
		return nil, fmt.Errorf("vmlinux: not an x86-64 ELF (class %v machine %v)", f.Class, f.Machine)
	}
	k := &Kernel{Entry: f.Entry, InitrdAddrMax: 0x7fffffff, CmdlineSize: 2048, Version: minVersion}
	var lo, hi uint64 = ^uint64(0), 0
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD {
			continue
		}
		if p.Filesz > p.Memsz || p.Paddr+p.Memsz < p.Paddr {
			return nil, fmt.Errorf("vmlinux: bad segment at %#x", p.Paddr)
		}
		data := make([]byte, p.Filesz)
		if _, err := p.ReadAt(data, 0); err != nil && err != io.EOF {
			return nil, fmt.Errorf("vmlinux: read segment at %#x: %w", p.Paddr, err)
		}
		// Memsz beyond Filesz is .bss: guest RAM is zero already.
		k.Segments = append(k.Segments, Segment{GPA: p.Paddr, Data: data})
		lo, hi = min(lo, p.Paddr), max(hi, p.Paddr+p.Memsz)
	}
	if len(k.Segments) == 0 {
		return nil, fmt.Errorf("vmlinux: no loadable segments")
	}
	if k.Entry < lo || k.Entry >= hi {
		return nil, fmt.Errorf("vmlinux: entry %#x outside the loaded image [%#x,%#x)", k.Entry, lo, hi)
	}
	k.InitSize = hi - lo
	k.End = hi
	return k, nil
}
