// Package acpi builds the ACPI tables a Linux guest needs on a machine
// without firmware: RSDP → XSDT → FADT (hardware-reduced, with sleep and
// reset registers), MADT (one local APIC per vCPU, the IOAPIC, the ISA
// IRQ0→GSI2 override) and a DSDT (PCI host bridge, \_S5 for power-off,
// the serial ports and, optionally, the VM generation id device).
// Debian's kernel has no MP-table support, so the MADT is how it finds
// secondary CPUs.
package acpi

import (
	"encoding/binary"
	"fmt"
)

var le = binary.LittleEndian

// Addresses of the interrupt controllers (x86 defaults KVM emulates).
const (
	LAPICAddr  = 0xfee00000
	IOAPICAddr = 0xfec00000
)

// Config describes the machine the tables advertise.
type Config struct {
	// Base is the guest-physical address the blob will be written at;
	// the RSDP sits at Base (16-byte aligned, inside 0xe0000-0xfffff if
	// the guest is to find it by scanning).
	Base uint64
	CPUs int
	// SleepPort receives SLP_TYP<<2|SLP_EN on power-off (one byte).
	// ResetPort receives ResetValue on reboot.
	SleepPort  uint16
	ResetPort  uint16
	ResetValue uint8
	// PCI, if set, adds a host bridge with these windows to the DSDT.
	PCI *PCIWindows
	// Serial lists 16550 UARTs to describe in the DSDT. A hardware-reduced
	// guest sets up no legacy ISA interrupts, so a UART's IRQ only works
	// if ACPI describes it (Linux's 8250_pnp then maps the GSI).
	Serial []SerialPort
	// VMGenID, if set, adds the VM generation id device and the Generic
	// Event Device that notifies it (vmgenid.go).
	VMGenID *VMGenID
}

// SerialPort is one UART: 8 I/O ports at Base, edge interrupt on GSI.
type SerialPort struct {
	Base uint16
	GSI  uint32
}

// PCIWindows are the resources the host bridge forwards.
type PCIWindows struct {
	MMIO32Base, MMIO32Size uint64
	MMIO64Base, MMIO64Size uint64
}

// Values the guest writes to the sleep control register.
const (
	SleepTypeS5 = 5      // our \_S5 package's SLP_TYPa
	SleepEnable = 1 << 5 // SLP_EN
)

// S5Value is the byte a hardware-reduced guest writes to power off.
const S5Value = SleepTypeS5<<2 | SleepEnable

const (
	oemID      = "CUBE  "
	creatorID  = "CUBE"
	headerSize = 36
)

// header writes an SDT header; length and checksum are fixed up by finish.
func header(sig string, rev byte, tableID string) []byte {
	h := make([]byte, headerSize)
	copy(h[0:4], sig)
	h[8] = rev
	copy(h[10:16], oemID)
	copy(h[16:24], fmt.Sprintf("%-8s", tableID))
	le.PutUint32(h[24:], 1) // OEM revision
	copy(h[28:32], creatorID)
	le.PutUint32(h[32:], 1)
	return h
}

// finish sets length and checksum.
func finish(t []byte) []byte {
	le.PutUint32(t[4:], uint32(len(t)))
	t[9] = 0
	t[9] = -sum(t)
	return t
}

func sum(b []byte) byte {
	var s byte
	for _, c := range b {
		s += c
	}
	return s
}

// gas is a Generic Address Structure for an I/O port of width bytes.
func gas(port uint16, width int) []byte {
	g := make([]byte, 12)
	g[0] = 1 // SystemIO
	g[1] = byte(8 * width)
	g[3] = byte(width) // access size: 1=byte, 2=word, 3=dword
	le.PutUint64(g[4:], uint64(port))
	return g
}

// FADT offsets (ACPI 6.4 Table 5.9).
const (
	fadtSize          = 276
	fadtDSDT          = 40
	fadtIAPCBootArch  = 109
	fadtFlags         = 112
	fadtResetReg      = 116
	fadtResetValue    = 128
	fadtMinorVersion  = 131
	fadtXDSDT         = 140
	fadtSleepControl  = 244
	fadtSleepStatus   = 256
	fadtHypervisorID  = 268
	flagResetRegSup   = 1 << 10
	flagHWReduced     = 1 << 20
	bootArchNoVGA     = 1 << 2
	bootArchNoCMOSRTC = 1 << 5
)

// FADT builds the Fixed ACPI Description Table (revision 6.4).
func FADT(cfg Config, dsdtAddr uint64) []byte {
	t := append(header("FACP", 6, "CUBEFACP"), make([]byte, fadtSize-headerSize)...)
	le.PutUint32(t[fadtDSDT:], uint32(dsdtAddr))
	// No VGA, no CMOS RTC, and no 8042 bit: the guest skips probing
	// devices we do not emulate (our i8042 only takes the reset command).
	le.PutUint16(t[fadtIAPCBootArch:], bootArchNoVGA|bootArchNoCMOSRTC)
	le.PutUint32(t[fadtFlags:], flagHWReduced|flagResetRegSup)
	copy(t[fadtResetReg:], gas(cfg.ResetPort, 1))
	t[fadtResetValue] = cfg.ResetValue
	t[fadtMinorVersion] = 4
	le.PutUint64(t[fadtXDSDT:], dsdtAddr)
	copy(t[fadtSleepControl:], gas(cfg.SleepPort, 1))
	copy(t[fadtSleepStatus:], gas(cfg.SleepPort, 1))
	copy(t[fadtHypervisorID:], "CUBEVMM ")
	return finish(t)
}

// MADT builds the Multiple APIC Description Table.
func MADT(cpus int) []byte {
	t := header("APIC", 5, "CUBEAPIC")
	t = le.AppendUint32(t, LAPICAddr)
	t = le.AppendUint32(t, 1) // PCAT_COMPAT: there are 8259s too
	for i := 0; i < cpus; i++ {
		// Processor Local APIC: uid, APIC id, enabled.
		t = append(t, 0, 8, byte(i), byte(i))
		t = le.AppendUint32(t, 1)
	}
	// I/O APIC id 0 at IOAPICAddr serving GSIs from 0.
	t = append(t, 1, 12, 0, 0)
	t = le.AppendUint32(t, IOAPICAddr)
	t = le.AppendUint32(t, 0)
	// Interrupt Source Override: ISA IRQ 0 (PIT) is GSI 2 on the IOAPIC.
	t = append(t, 2, 10, 0, 0)
	t = le.AppendUint32(t, 2)
	t = le.AppendUint16(t, 0)
	return finish(t)
}

// DSDT builds the Differentiated System Description Table.
func DSDT(cfg Config) []byte {
	t := header("DSDT", 2, "CUBEDSDT")
	// \_S5: SLP_TYPa for power-off (hardware-reduced sleep register).
	t = append(t, Name("\\_S5", Package(Integer(SleepTypeS5), Integer(0)))...)
	var sb [][]byte
	for i, p := range cfg.Serial {
		sb = append(sb, Device(fmt.Sprintf("COM%d", i+1),
			Name("_HID", EISAID("PNP0501")),
			Name("_UID", Integer(uint64(i+1))),
			Name("_CRS", ResourceTemplate(IOPort(p.Base, p.Base, 1, 8), Interrupt(p.GSI))),
		))
	}
	if w := cfg.PCI; w != nil {
		crs := []([]byte){
			WordBusNumber(0, 0),
			IOPort(0xcf8, 0xcf8, 1, 8),
			WordIO(0x0000, 0x0cf7),
			WordIO(0x0d00, 0xffff),
		}
		if w.MMIO32Size > 0 {
			crs = append(crs, DWordMemory(uint32(w.MMIO32Base), uint32(w.MMIO32Base+w.MMIO32Size-1)))
		}
		if w.MMIO64Size > 0 {
			crs = append(crs, QWordMemory(w.MMIO64Base, w.MMIO64Base+w.MMIO64Size-1))
		}
		sb = append(sb,
			Device("PCI0",
				Name("_HID", EISAID("PNP0A03")),
				Name("_ADR", Integer(0)),
				Name("_SEG", Integer(0)),
				Name("_UID", Integer(0)),
				Name("_BBN", Integer(0)),
				Name("_CRS", ResourceTemplate(crs...)),
			))
	}
	if cfg.VMGenID != nil {
		sb = append(sb, vmgenidDevices(*cfg.VMGenID)...)
	}
	if len(sb) > 0 {
		t = append(t, Scope("\\_SB", sb...)...)
	}
	return finish(t)
}

// XSDT lists the other tables by address.
func XSDT(addrs []uint64) []byte {
	t := header("XSDT", 1, "CUBEXSDT")
	for _, a := range addrs {
		t = le.AppendUint64(t, a)
	}
	return finish(t)
}

// RSDP builds the revision-2 Root System Description Pointer.
func RSDP(xsdtAddr uint64) []byte {
	r := make([]byte, 36)
	copy(r[0:8], "RSD PTR ")
	copy(r[9:15], oemID)
	r[15] = 2
	le.PutUint32(r[20:], 36)
	le.PutUint64(r[24:], xsdtAddr)
	r[8] = -sum(r[:20])
	r[32] = -sum(r)
	return r
}

// Build lays out RSDP, XSDT, FADT, DSDT and MADT back to back from
// cfg.Base and returns the blob to write there; the RSDP is at cfg.Base.
func Build(cfg Config) ([]byte, error) {
	if cfg.CPUs < 1 || cfg.CPUs > 254 {
		return nil, fmt.Errorf("acpi: %d vCPUs not in 1..254 (xAPIC ids)", cfg.CPUs)
	}
	if cfg.Base%16 != 0 {
		return nil, fmt.Errorf("acpi: base %#x not 16-byte aligned", cfg.Base)
	}
	align := func(n uint64) uint64 { return (n + 15) &^ 15 }
	rsdpAddr := cfg.Base
	dsdt := DSDT(cfg)
	dsdtAddr := align(rsdpAddr + 36)
	fadtAddr := align(dsdtAddr + uint64(len(dsdt)))
	fadt := FADT(cfg, dsdtAddr)
	madtAddr := align(fadtAddr + uint64(len(fadt)))
	madt := MADT(cfg.CPUs)
	xsdtAddr := align(madtAddr + uint64(len(madt)))
	xsdt := XSDT([]uint64{fadtAddr, madtAddr})
	blob := make([]byte, xsdtAddr+uint64(len(xsdt))-cfg.Base)
	put := func(addr uint64, t []byte) { copy(blob[addr-cfg.Base:], t) }
	put(rsdpAddr, RSDP(xsdtAddr))
	put(dsdtAddr, dsdt)
	put(fadtAddr, fadt)
	put(madtAddr, madt)
	put(xsdtAddr, xsdt)
	return blob, nil
}
