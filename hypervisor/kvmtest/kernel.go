package kvmtest

import "encoding/binary"

// SyntheticBzImage wraps 64-bit code in a minimal bzImage (boot protocol
// 2.15, 64-bit entry) whose 64-bit entry point is the code's first byte.
// It lets the whole boot path (kernel loading, zero page, boot vCPU state,
// ACPI, devices) run on hosts that cannot run Linux guests.
func SyntheticBzImage(code []byte) []byte {
	img := make([]byte, 2*512) // boot sector + one setup sector
	le := binary.LittleEndian
	img[0x1f1] = 1 // setup_sects
	le.PutUint16(img[0x1fe:], 0xaa55)
	img[0x200], img[0x201] = 0xeb, 0x6a // jump over the header (ends at 0x26c)
	le.PutUint32(img[0x202:], 0x53726448)
	le.PutUint16(img[0x206:], 0x020f)
	img[0x211] = 1 // LOADED_HIGH
	le.PutUint32(img[0x22c:], 0x7fffffff)
	le.PutUint16(img[0x236:], 1) // XLF_KERNEL_64
	le.PutUint32(img[0x238:], 2047)
	le.PutUint32(img[0x260:], 0x100000) // init_size
	img = append(img, make([]byte, 0x200)...)
	return append(img, code...)
}

// ConsoleProgram prints msg on COM1 (port 0x3f8), then runs then.
func ConsoleProgram(msg string, then []byte) []byte {
	head := []byte{
		0x48, 0x8d, 0x35, 0, 0, 0, 0, // lea rsi, [rip+msg]
		0x66, 0xba, 0xf8, 0x03, // mov dx, 0x3f8
		0xac,       // L: lodsb
		0x84, 0xc0, // test al, al
		0x74, 0x03, // jz done
		0xee,       // out dx, al
		0xeb, 0xf8, // jmp L
	}
	code := append(head, then...)
	binary.LittleEndian.PutUint32(code[3:], uint32(len(code)-7))
	return append(code, append([]byte(msg), 0)...)
}

// Endings for ConsoleProgram.
var (
	// ThenPowerOff writes S5|SLP_EN to the ACPI sleep control port 0x600.
	ThenPowerOff = []byte{0x66, 0xba, 0x00, 0x06, 0xb0, 0x34, 0xee, 0xf4, 0xeb, 0xfd}
	// ThenI8042Reset writes 0xfe to the keyboard controller's port 0x64.
	ThenI8042Reset = []byte{0xb0, 0xfe, 0xe6, 0x64, 0xf4, 0xeb, 0xfd}
	// ThenACPIReset writes 1 to the ACPI reset register at port 0x601.
	ThenACPIReset = []byte{0x66, 0xba, 0x01, 0x06, 0xb0, 0x01, 0xee, 0xf4, 0xeb, 0xfd}
	// ThenHang halts forever with interrupts off.
	ThenHang = []byte{0xf4, 0xeb, 0xfd}
)

// TickerProgram writes ch to COM1 every 4096 turns of a counting loop,
// forever: a guest whose console output goes on after a snapshot of it is
// restored. (At CPL0 under PVM a turn costs ~10 µs: ch every few tens of ms.)
func TickerProgram(ch byte) []byte {
	return []byte{
		0x48, 0x31, 0xdb, // xor rbx, rbx
		0x48, 0xff, 0xc3, // loop: inc rbx
		0xf7, 0xc3, 0xff, 0x0f, 0x00, 0x00, // test ebx, 0xfff
		0x75, 0xf5, // jnz loop
		0x66, 0xba, 0xf8, 0x03, // mov dx, 0x3f8
		0xb0, ch, // mov al, ch
		0xee,       // out dx, al
		0xeb, 0xec, // jmp loop
	}
}
