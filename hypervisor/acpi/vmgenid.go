package acpi

// The VM generation ID device (Microsoft's "Virtual Machine Generation ID"
// specification, as Linux's drivers/virt/vmgenid.c reads it) and the
// Generic Event Device that tells the guest the id changed.
//
// Linux binds its vmgenid driver to a device whose _HID or _CID is
// "VMGENCTR" or "VM_GEN_COUNTER", evaluates its ADDR object (a package of
// two integers: the low and high 32 bits of the guest-physical address of
// the 16-byte id), maps the id and mixes it into the RNG at probe; on a
// device notification it reads the id again and, if it changed, reseeds
// the CRNG at once (add_vmfork_randomness). A hardware-reduced machine has
// no GPE block to raise that notification from, so a Generic Event Device
// (ACPI0013, Linux's built-in drivers/acpi/evged.c) owns one interrupt and
// its _EVT method does Notify(\_SB.VGEN, 0x80) when that interrupt fires.

// VMGenIDNotify is the notification value the GED sends the id device
// (0x80: the first device-specific value, what QEMU and Hyper-V send).
const VMGenIDNotify = 0x80

// VMGenID places the generation id device.
type VMGenID struct {
	// Addr is the guest-physical address of the 16-byte id; it must be in
	// memory the e820 map reserves (the guest maps it, never allocates it).
	Addr uint64
	// GSI is the edge-triggered interrupt that makes the GED notify the
	// id device.
	GSI uint32
}

// vmgenidDevices returns the \_SB devices VGEN (the id) and GED (its
// notification).
func vmgenidDevices(g VMGenID) [][]byte {
	return [][]byte{
		Device("VGEN",
			Name("_HID", String("VMGENCTR")),
			Name("_CID", String("VM_GEN_COUNTER")),
			Name("_DDN", String("VM_Gen_Counter")),
			Name("ADDR", Package(Integer(g.Addr&0xffffffff), Integer(g.Addr>>32))),
		),
		Device("GED",
			Name("_HID", String("ACPI0013")),
			Name("_UID", Integer(0)),
			Name("_CRS", ResourceTemplate(Interrupt(g.GSI))),
			Method("_EVT", 1,
				If(LEqual(Arg(0), Integer(uint64(g.GSI))),
					Notify("\\_SB.VGEN", VMGenIDNotify))),
		),
	}
}
