package acpi

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestAMLEncodings(t *testing.T) {
	cases := []struct {
		name      string
		got, want []byte
	}{
		{"eisaid", EISAID("PNP0A03"), []byte{0x0c, 0x41, 0xd0, 0x0a, 0x03}},
		{"int0", Integer(0), []byte{0}},
		{"int1", Integer(1), []byte{1}},
		{"byte", Integer(5), []byte{0x0a, 5}},
		{"word", Integer(0x1234), []byte{0x0b, 0x34, 0x12}},
		{"dword", Integer(0x12345678), []byte{0x0c, 0x78, 0x56, 0x34, 0x12}},
		{"qword", Integer(1 << 32), []byte{0x0e, 0, 0, 0, 0, 1, 0, 0, 0}},
		{"root name", nameString("\\_S5"), []byte{'\\', '_', 'S', '5', '_'}},
		{"dual name", nameString("_SB.PCI0"), []byte{0x2e, '_', 'S', 'B', '_', 'P', 'C', 'I', '0'}},
		{"s5", Name("\\_S5", Package(Integer(5), Integer(0))),
			[]byte{0x08, '\\', '_', 'S', '5', '_', 0x12, 0x05, 0x02, 0x0a, 0x05, 0x00}},
		{"pkglen 1", pkgLength(62), []byte{63}},
		{"pkglen 2", pkgLength(63), []byte{0x40 | (65 & 0xf), 65 >> 4}},
		{"pkglen 2 max", pkgLength(0xfff - 2), []byte{0x4f, 0xff}},
		{"pkglen 3", pkgLength(0xfff - 1), []byte{0x80 | 0x1, 0x00, 0x01}}, // total 0x1001
		{"ioport", IOPort(0xcf8, 0xcf8, 1, 8), []byte{0x47, 1, 0xf8, 0x0c, 0xf8, 0x0c, 1, 8}},
		{"interrupt", Interrupt(4), []byte{0x89, 6, 0, 3, 1, 4, 0, 0, 0}},
		{"string", String("AB"), []byte{0x0d, 'A', 'B', 0}},
		{"arg0", Arg(0), []byte{0x68}},
		{"arg6", Arg(6), []byte{0x6e}},
		{"lequal", LEqual(Arg(0), Integer(5)), []byte{0x93, 0x68, 0x0a, 5}},
		{"notify", Notify("\\_SB.VGEN", 0x80),
			[]byte{0x86, '\\', 0x2e, '_', 'S', 'B', '_', 'V', 'G', 'E', 'N', 0x0a, 0x80}},
		{"if", If(Integer(1), Integer(0)), []byte{0xa0, 3, 1, 0}},
		// Method(_EVT, 1){}: PkgLength 6 covers itself, the name and the flags.
		{"method", Method("_EVT", 1), []byte{0x14, 6, '_', 'E', 'V', 'T', 1}},
	}
	for _, c := range cases {
		if !bytes.Equal(c.got, c.want) {
			t.Errorf("%s: % x, want % x", c.name, c.got, c.want)
		}
	}
}

var testCfg = Config{Base: 0xe0000, CPUs: 2, SleepPort: 0x3c0, ResetPort: 0x3c1, ResetValue: 1,
	PCI:     &PCIWindows{MMIO32Base: 0xc0000000, MMIO32Size: 0x3c000000, MMIO64Base: 1 << 40, MMIO64Size: 1 << 36},
	Serial:  []SerialPort{{Base: 0x3f8, GSI: 4}},
	VMGenID: &VMGenID{Addr: 0x1_000fe000, GSI: 5}}

// tables walks the blob from the RSDP and returns each table by signature.
func tables(t *testing.T, blob []byte, base uint64) map[string][]byte {
	t.Helper()
	at := func(addr uint64) []byte {
		if addr < base || addr-base+36 > uint64(len(blob)) {
			t.Fatalf("table address %#x outside the blob", addr)
		}
		b := blob[addr-base:]
		n := le.Uint32(b[4:])
		if uint64(n) > uint64(len(b)) {
			t.Fatalf("table at %#x claims %d bytes", addr, n)
		}
		if sum(b[:n]) != 0 {
			t.Errorf("table %q checksum bad", b[:4])
		}
		return b[:n]
	}
	r := blob[:36]
	if string(r[:8]) != "RSD PTR " || sum(r[:20]) != 0 || sum(r) != 0 || r[15] != 2 {
		t.Fatalf("rsdp bad: % x", r)
	}
	out := map[string][]byte{}
	x := at(le.Uint64(r[24:]))
	out["XSDT"] = x
	for off := 36; off+8 <= len(x); off += 8 {
		tb := at(le.Uint64(x[off:]))
		out[string(tb[:4])] = tb
	}
	if f, ok := out["FACP"]; ok {
		out["DSDT"] = at(le.Uint64(f[fadtXDSDT:]))
	}
	return out
}

func TestBuild(t *testing.T) {
	blob, err := Build(testCfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(blob) > 0x20000 {
		t.Fatalf("blob of %d bytes exceeds the BIOS area", len(blob))
	}
	tb := tables(t, blob, testCfg.Base)
	for _, sig := range []string{"XSDT", "FACP", "APIC", "DSDT"} {
		if tb[sig] == nil {
			t.Fatalf("no %s reachable from the RSDP", sig)
		}
	}
	f := tb["FACP"]
	if len(f) != 276 || f[8] != 6 {
		t.Errorf("FADT length %d revision %d", len(f), f[8])
	}
	if fl := le.Uint32(f[fadtFlags:]); fl&flagHWReduced == 0 || fl&flagResetRegSup == 0 {
		t.Errorf("FADT flags %#x", fl)
	}
	if f[fadtSleepControl] != 1 || le.Uint64(f[fadtSleepControl+4:]) != 0x3c0 ||
		le.Uint64(f[fadtResetReg+4:]) != 0x3c1 || f[fadtResetValue] != 1 {
		t.Errorf("FADT registers: sleep % x reset % x value %d", f[fadtSleepControl:fadtSleepControl+12], f[fadtResetReg:fadtResetReg+12], f[fadtResetValue])
	}

	m := tb["APIC"]
	if le.Uint32(m[36:]) != LAPICAddr {
		t.Errorf("MADT LAPIC address %#x", le.Uint32(m[36:]))
	}
	var lapics, ioapics, overrides int
	for off := 44; off < len(m); {
		typ, n := m[off], int(m[off+1])
		if n < 2 || off+n > len(m) {
			t.Fatalf("MADT entry at %d has length %d", off, n)
		}
		switch typ {
		case 0:
			if m[off+3] != byte(lapics) || le.Uint32(m[off+4:])&1 == 0 {
				t.Errorf("LAPIC entry %d: % x", lapics, m[off:off+n])
			}
			lapics++
		case 1:
			ioapics++
			if le.Uint32(m[off+4:]) != IOAPICAddr {
				t.Errorf("IOAPIC address %#x", le.Uint32(m[off+4:]))
			}
		case 2:
			overrides++
		}
		off += n
	}
	if lapics != 2 || ioapics != 1 || overrides != 1 {
		t.Errorf("MADT: %d LAPICs, %d IOAPICs, %d overrides", lapics, ioapics, overrides)
	}
	d := tb["DSDT"]
	if !bytes.Contains(d, []byte("_S5_")) || !bytes.Contains(d, []byte("PCI0")) || !bytes.Contains(d, []byte("_CRS")) {
		t.Error("DSDT lacks _S5_, PCI0 or _CRS")
	}
}

func TestBuildRejects(t *testing.T) {
	for _, c := range []Config{{Base: 0xe0000, CPUs: 0}, {Base: 0xe0000, CPUs: 255}, {Base: 0xe0001, CPUs: 1}} {
		if _, err := Build(c); err == nil {
			t.Errorf("Build(%+v) accepted", c)
		}
	}
}

// TestDSDTDisassembles feeds the DSDT to ACPICA's disassembler, which
// parses every AML opcode and would report a malformed stream.
func TestDSDTDisassembles(t *testing.T) {
	iasl, err := exec.LookPath("iasl")
	if err != nil {
		t.Skip("iasl (acpica-tools) not installed: cannot disassemble the DSDT")
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "dsdt.dat")
	if err := os.WriteFile(p, DSDT(testCfg), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(iasl, "-d", p).CombinedOutput()
	if err != nil {
		t.Fatalf("iasl -d: %v\n%s", err, out)
	}
	dsl, err := os.ReadFile(filepath.Join(dir, "dsdt.dsl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`Name (\_S5, Package (0x02)`, "Device (PCI0)", `EisaId ("PNP0A03")`,
		"WordBusNumber", "IO (Decode16,", "DWordMemory", "QWordMemory", "0xC0000000,",
		"Device (COM1)", `EisaId ("PNP0501")`, "Interrupt (ResourceConsumer, Edge, ActiveHigh, Exclusive, ,, )", "0x00000004,",
		// The generation id as Linux's vmgenid driver reads it, and its GED.
		"Device (VGEN)", `Name (_HID, "VMGENCTR")`, `Name (_CID, "VM_GEN_COUNTER")`, "Name (ADDR, Package (0x02)",
		"0x000FE000,", "One", "Device (GED)", `Name (_HID, "ACPI0013" /* Generic Event Device */)`, "0x00000005,",
		"Method (_EVT, 1, NotSerialized)", "If ((Arg0 == 0x05))", `Notify (\_SB.VGEN, 0x80)`} {
		if !strings.Contains(string(dsl), want) {
			t.Errorf("disassembly lacks %q:\n%s", want, dsl)
		}
	}
}

// TestVMGenIDDevices finds the generation id's ADDR package and the GED's
// _EVT in the DSDT, as Linux would evaluate them.
func TestVMGenIDDevices(t *testing.T) {
	d := DSDT(testCfg)
	if sum(d) != 0 {
		t.Fatal("DSDT checksum bad")
	}
	addr := Name("ADDR", Package(Integer(0x000fe000), Integer(1)))
	if !bytes.Contains(d, addr) {
		t.Errorf("DSDT lacks the ADDR package % x", addr)
	}
	evt := Method("_EVT", 1, If(LEqual(Arg(0), Integer(5)), Notify("\\_SB.VGEN", VMGenIDNotify)))
	if !bytes.Contains(d, evt) {
		t.Errorf("DSDT lacks the GED's _EVT % x", evt)
	}
	for _, s := range []string{"VMGENCTR\x00", "VM_GEN_COUNTER\x00", "ACPI0013\x00"} {
		if !bytes.Contains(d, []byte(s)) {
			t.Errorf("DSDT lacks %q", s)
		}
	}
	without := testCfg
	without.VMGenID = nil
	if bytes.Contains(DSDT(without), []byte("VGEN")) || bytes.Contains(DSDT(without), []byte("ACPI0013")) {
		t.Error("DSDT without VMGenID has its devices")
	}
}
