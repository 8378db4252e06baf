package boot

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/kvm"
	"github.com/cube-runtime/cube/hypervisor/memory"
)

// fakeBzImage builds a minimal valid bzImage: setup_sects setup sectors
// plus a payload.
func fakeBzImage(setupSects int, payload []byte) []byte {
	img := make([]byte, (setupSects+1)*512)
	img[offSetupSects] = byte(setupSects)
	le.PutUint16(img[offBootFlag:], bootFlag)
	img[offJump] = 0xeb
	img[0x201] = 0x6a // header ends at 0x26c
	le.PutUint32(img[offHeaderMagic:], headerMagic)
	le.PutUint16(img[offVersion:], 0x020f)
	img[offLoadFlags] = loadedHigh
	le.PutUint32(img[offInitrdAddrMax:], 0x7fffffff)
	le.PutUint16(img[offXLoadFlags:], xlfKernel64)
	le.PutUint32(img[offCmdlineSize:], 2047)
	le.PutUint32(img[offInitSize:], 0x200000)
	return append(img, payload...)
}

func TestParseBzImage(t *testing.T) {
	payload := bytes.Repeat([]byte{0x90}, 1000)
	k, err := ParseBzImage(fakeBzImage(3, payload))
	if err != nil {
		t.Fatal(err)
	}
	if k.Entry != 0x100200 || len(k.Segments) != 1 || k.Segments[0].GPA != 0x100000 || !bytes.Equal(k.Segments[0].Data, payload) {
		t.Errorf("kernel %+v", k)
	}
	if k.CmdlineSize != 2047 || k.InitSize != 0x200000 || k.InitrdAddrMax != 0x7fffffff || len(k.Setup) != 0x26c-0x1f1 {
		t.Errorf("header fields %+v", k)
	}

	mut := func(f func([]byte)) []byte { b := fakeBzImage(3, payload); f(b); return b }
	bad := map[string][]byte{
		"short":     make([]byte, 100),
		"magic":     mut(func(b []byte) { b[offHeaderMagic] = 0 }),
		"old":       mut(func(b []byte) { le.PutUint16(b[offVersion:], 0x0206) }),
		"no64":      mut(func(b []byte) { le.PutUint16(b[offXLoadFlags:], 0) }),
		"low":       mut(func(b []byte) { b[offLoadFlags] = 0 }),
		"truncated": fakeBzImage(3, nil),
		"no jump":   mut(func(b []byte) { b[offJump] = 0 }),
	}
	for name, img := range bad {
		if _, err := ParseBzImage(img); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := LoadKernel([]byte("plain text")); !errors.Is(err, ErrNotBzImage) {
		t.Errorf("plain text: %v", err)
	}
}

func TestZeroPageLayout(t *testing.T) {
	k, err := ParseBzImage(fakeBzImage(1, []byte{1}))
	if err != nil {
		t.Fatal(err)
	}
	e820 := []E820Entry{{0, 0x9fc00, E820RAM}, {0x100000, 0x1000000, E820RAM}}
	zp, err := ZeroPage(Params{Kernel: k, CmdlineAddr: 0x20000, CmdlineLen: 10, InitrdAddr: 0x800000,
		InitrdSize: 0x1234, E820: e820, RSDPAddr: 0xe0000})
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name string
		got  uint64
		want uint64
	}{
		{"hdr magic", uint64(le.Uint32(zp[0x202:])), headerMagic},
		{"boot_flag", uint64(le.Uint16(zp[0x1fe:])), bootFlag},
		{"type_of_loader", uint64(zp[0x210]), 0xff},
		{"loadflags", uint64(zp[0x211]), loadedHigh | canUseHeap},
		{"heap_end_ptr", uint64(le.Uint16(zp[0x224:])), 0xfe00},
		{"cmd_line_ptr", uint64(le.Uint32(zp[0x228:])), 0x20000},
		{"ramdisk_image", uint64(le.Uint32(zp[0x218:])), 0x800000},
		{"ramdisk_size", uint64(le.Uint32(zp[0x21c:])), 0x1234},
		{"acpi_rsdp_addr", le.Uint64(zp[0x70:]), 0xe0000},
		{"e820_entries", uint64(zp[0x1e8]), 2},
		{"e820[1].addr", le.Uint64(zp[0x2d0+20:]), 0x100000},
		{"e820[1].size", le.Uint64(zp[0x2d0+28:]), 0x1000000},
		{"e820[1].type", uint64(le.Uint32(zp[0x2d0+36:])), E820RAM},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
	if _, err := ZeroPage(Params{Kernel: k, E820: nil}); err == nil {
		t.Error("empty e820 accepted")
	}
	if _, err := ZeroPage(Params{Kernel: k, E820: e820, CmdlineLen: 5000}); err == nil {
		t.Error("over-long command line accepted")
	}
	if _, err := ZeroPage(Params{Kernel: k, E820: e820, InitrdAddr: 0xfffff000, InitrdSize: 0x2000}); err == nil {
		t.Error("initrd above 4 GiB accepted")
	}
}

func TestSetup(t *testing.T) {
	ram := memory.X86Layout(64 << 20)
	mem, err := memory.New(ram, memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	k, err := ParseBzImage(fakeBzImage(1, []byte{0xf4, 0xf4}))
	if err != nil {
		t.Fatal(err)
	}
	initrd := bytes.Repeat([]byte{0x5a}, 5000)
	l, err := Setup(mem, ram, Image{Kernel: k, Cmdline: "console=ttyS0", Initrd: initrd, RSDPAddr: ACPIAddr})
	if err != nil {
		t.Fatal(err)
	}
	if l.InitrdAddr%4096 != 0 || l.InitrdAddr+5000 > 64<<20 || l.InitrdAddr < 64<<20-2*4096 {
		t.Errorf("initrd at %#x, want the last pages below 64 MiB", l.InitrdAddr)
	}
	got := make([]byte, 5000)
	mem.ReadAt(got, int64(l.InitrdAddr))
	if !bytes.Equal(got, initrd) {
		t.Error("initrd bytes differ")
	}
	cmd := make([]byte, 14)
	mem.ReadAt(cmd, CmdlineAddr)
	if string(cmd) != "console=ttyS0\x00" {
		t.Errorf("cmdline %q", cmd)
	}
	if b, _ := mem.Slice(0x100000, 2); !bytes.Equal(b, []byte{0xf4, 0xf4}) {
		t.Errorf("kernel bytes %x", b)
	}
	if pml4, _ := mem.ReadUint64(PML4Addr); pml4 != PDPTAddr|3 {
		t.Errorf("pml4[0] = %#x", pml4)
	}
	if pd, _ := mem.ReadUint64(PDAddr + 8*511); pd != 511<<21|0x83 {
		t.Errorf("pd[511] = %#x", pd)
	}
	want := []E820Entry{{0, EBDAStart, E820RAM}, {EBDAStart, 0xa0000 - EBDAStart, E820Reserved},
		{ACPIAddr, ACPIEnd - ACPIAddr, E820Reserved}, {0x100000, 63 << 20, E820RAM}}
	if len(l.E820) != len(want) {
		t.Fatalf("e820 %v", l.E820)
	}
	for i := range want {
		if l.E820[i] != want[i] {
			t.Errorf("e820[%d] = %+v, want %+v", i, l.E820[i], want[i])
		}
	}
	// An initrd that would overlap the kernel's init_size is refused.
	if _, err := Setup(mem, ram, Image{Kernel: k, Initrd: make([]byte, 63<<20)}); err == nil {
		t.Error("oversized initrd accepted")
	}
}

func TestE820AboveHole(t *testing.T) {
	e, err := E820(memory.X86Layout(5 << 30))
	if err != nil {
		t.Fatal(err)
	}
	last := e[len(e)-1]
	if last != (E820Entry{4 << 30, 2 << 30, E820RAM}) {
		t.Errorf("last entry %+v", last)
	}
}

func TestCPUIDTopology(t *testing.T) {
	sup := []kvm.CPUIDEntry2{{Function: 1, EBX: 0xff00_0800}, {Function: 0xb, Index: 1, EDX: 7}, {Function: 0}}
	got := CPUID(sup, 3, 4)
	if got[0].EBX != 0x0304_0800 || got[0].EDX&(1<<28) == 0 || got[0].ECX&(1<<31) == 0 {
		t.Errorf("leaf 1 = %+v", got[0])
	}
	if got[1].EDX != 3 {
		t.Errorf("leaf 0xb edx = %d", got[1].EDX)
	}
	if sup[0].EBX != 0xff00_0800 {
		t.Error("input table modified")
	}
}

func TestGDTDescriptors(t *testing.T) {
	g := GDT()
	cs := le.Uint64(g[BootCS:])
	if cs>>53&1 != 1 || cs>>47&1 != 1 || cs>>43&1 != 1 {
		t.Errorf("code descriptor %#x: want L, P and executable", cs)
	}
	ds := le.Uint64(g[BootDS:])
	if ds>>43&1 != 0 || ds>>41&1 != 1 {
		t.Errorf("data descriptor %#x: want writable data", ds)
	}
}

// TestRealKernel parses a real bzImage when CUBE_TEST_KERNEL names one.
func TestRealKernel(t *testing.T) {
	p := os.Getenv("CUBE_TEST_KERNEL")
	if p == "" {
		t.Skip("CUBE_TEST_KERNEL not set: no real kernel image to parse")
	}
	img, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	k, err := LoadKernel(img)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("protocol %#x, init_size %#x, cmdline_size %d, initrd_addr_max %#x", k.Version, k.InitSize, k.CmdlineSize, k.InitrdAddrMax)
}

func FuzzLoadKernel(f *testing.F) {
	f.Add(fakeBzImage(1, []byte{1, 2, 3}))
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	f.Add(make([]byte, 0x300))
	f.Fuzz(func(t *testing.T, img []byte) {
		k, err := LoadKernel(img)
		if err != nil {
			return
		}
		// Whatever parses must describe itself consistently.
		if len(k.Segments) == 0 {
			t.Fatal("kernel without segments")
		}
	})
}

// TestVMGenIDReserved: the generation id sits in memory the e820 map
// reserves, apart from the reset stub's page, and is not guest RAM.
func TestVMGenIDReserved(t *testing.T) {
	e, err := E820(memory.X86Layout(256 << 20))
	if err != nil {
		t.Fatal(err)
	}
	var in E820Entry
	for _, r := range e {
		if VMGenIDAddr >= r.Addr && VMGenIDAddr+16 <= r.Addr+r.Size {
			in = r
		}
	}
	if in.Type != E820Reserved {
		t.Errorf("the generation id at %#x is in e820 entry %+v, want a reserved one", VMGenIDAddr, in)
	}
	if VMGenIDAddr%4096 != 0 || VMGenIDAddr>>12 == ResetVector>>12 || VMGenIDAddr < ACPIAddr || VMGenIDAddr >= ACPIEnd {
		t.Errorf("VMGenIDAddr %#x: want its own page inside [%#x, %#x), not the reset stub's", VMGenIDAddr, ACPIAddr, ACPIEnd)
	}
}
