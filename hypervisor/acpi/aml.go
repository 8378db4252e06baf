package acpi

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// A tiny AML encoder: just the objects our DSDT needs (names, integers,
// packages, buffers, scopes, devices and resource templates). Encodings
// follow ACPI 6.4 §20.

const (
	amlZero        = 0x00
	amlOne         = 0x01
	amlNameOp      = 0x08
	amlBytePrefix  = 0x0a
	amlWordPrefix  = 0x0b
	amlDWordPrefix = 0x0c
	amlStrPrefix   = 0x0d
	amlQWordPrefix = 0x0e
	amlScopeOp     = 0x10
	amlBufferOp    = 0x11
	amlPackageOp   = 0x12
	amlDualName    = 0x2e
	amlMultiName   = 0x2f
	amlRootChar    = 0x5c
	amlExtOp       = 0x5b
	amlDeviceOp    = 0x82
	amlMethodOp    = 0x14
	amlArg0Op      = 0x68
	amlNotifyOp    = 0x86
	amlLEqualOp    = 0x93
	amlIfOp        = 0xa0
)

// nameSeg pads a segment to four characters with '_'.
func nameSeg(s string) []byte {
	if len(s) > 4 {
		panic(fmt.Sprintf("acpi: name segment %q longer than 4", s)) // programming error: names are constants
	}
	return []byte(s + strings.Repeat("_", 4-len(s)))
}

// nameString encodes "\_SB.PCI0", "PCI0" or "_S5".
func nameString(n string) []byte {
	var out []byte
	if strings.HasPrefix(n, "\\") {
		out = append(out, amlRootChar)
		n = n[1:]
	}
	segs := strings.Split(n, ".")
	switch len(segs) {
	case 1:
	case 2:
		out = append(out, amlDualName)
	default:
		out = append(out, amlMultiName, byte(len(segs)))
	}
	for _, s := range segs {
		out = append(out, nameSeg(s)...)
	}
	return out
}

// pkgLength encodes a PkgLength covering body plus the length bytes.
func pkgLength(body int) []byte {
	if body+1 < 1<<6 {
		return []byte{byte(body + 1)}
	}
	for n := 2; n <= 4; n++ {
		total := body + n
		if total < 1<<(4+8*(n-1)) {
			out := []byte{byte((n-1)<<6 | total&0xf)}
			for i := 1; i < n; i++ {
				out = append(out, byte(total>>(4+8*(i-1))))
			}
			return out
		}
	}
	panic("acpi: AML package too large") // our tables are a few KiB
}

func withPkg(op []byte, body []byte) []byte {
	out := append([]byte(nil), op...)
	out = append(out, pkgLength(len(body))...)
	return append(out, body...)
}

// Integer encodes the shortest integer constant.
func Integer(v uint64) []byte {
	switch {
	case v == 0:
		return []byte{amlZero}
	case v == 1:
		return []byte{amlOne}
	case v <= 0xff:
		return []byte{amlBytePrefix, byte(v)}
	case v <= 0xffff:
		return binary.LittleEndian.AppendUint16([]byte{amlWordPrefix}, uint16(v))
	case v <= 0xffffffff:
		return binary.LittleEndian.AppendUint32([]byte{amlDWordPrefix}, uint32(v))
	}
	return binary.LittleEndian.AppendUint64([]byte{amlQWordPrefix}, v)
}

// String encodes a string constant.
func String(s string) []byte {
	return append(append([]byte{amlStrPrefix}, s...), 0)
}

// EISAID encodes a compressed EISA id such as "PNP0A03" as a DWord.
func EISAID(id string) []byte {
	if len(id) != 7 {
		panic("acpi: EISA id must be 7 characters")
	}
	hex := func(c byte) uint32 {
		switch {
		case c >= '0' && c <= '9':
			return uint32(c - '0')
		case c >= 'A' && c <= 'F':
			return uint32(c-'A') + 10
		}
		panic("acpi: bad EISA id digit")
	}
	v := uint32(id[0]-0x40)<<26 | uint32(id[1]-0x40)<<21 | uint32(id[2]-0x40)<<16 |
		hex(id[3])<<12 | hex(id[4])<<8 | hex(id[5])<<4 | hex(id[6])
	// Stored big-endian inside a little-endian DWord.
	return binary.BigEndian.AppendUint32([]byte{amlDWordPrefix}, v)
}

// Name encodes Name(name, value).
func Name(name string, value []byte) []byte {
	out := append([]byte{amlNameOp}, nameString(name)...)
	return append(out, value...)
}

// Package encodes Package(){elems...}.
func Package(elems ...[]byte) []byte {
	body := []byte{byte(len(elems))}
	for _, e := range elems {
		body = append(body, e...)
	}
	return withPkg([]byte{amlPackageOp}, body)
}

// Buffer encodes Buffer(){bytes}.
func Buffer(b []byte) []byte {
	body := append(Integer(uint64(len(b))), b...)
	return withPkg([]byte{amlBufferOp}, body)
}

// Scope encodes Scope(name){terms}.
func Scope(name string, terms ...[]byte) []byte {
	body := nameString(name)
	for _, t := range terms {
		body = append(body, t...)
	}
	return withPkg([]byte{amlScopeOp}, body)
}

// Device encodes Device(name){terms}.
func Device(name string, terms ...[]byte) []byte {
	body := nameString(name)
	for _, t := range terms {
		body = append(body, t...)
	}
	return withPkg([]byte{amlExtOp, amlDeviceOp}, body)
}

// Method encodes Method(name, args, NotSerialized){terms} (sync level 0).
func Method(name string, args int, terms ...[]byte) []byte {
	if args < 0 || args > 7 {
		panic("acpi: a method takes 0..7 arguments") // programming error: methods are constants
	}
	body := append(nameString(name), byte(args))
	for _, t := range terms {
		body = append(body, t...)
	}
	return withPkg([]byte{amlMethodOp}, body)
}

// Arg encodes ArgN, a method's Nth argument (0..6).
func Arg(n int) []byte {
	if n < 0 || n > 6 {
		panic("acpi: no Arg" + fmt.Sprint(n))
	}
	return []byte{byte(amlArg0Op + n)}
}

// LEqual encodes LEqual(a, b).
func LEqual(a, b []byte) []byte {
	return append(append([]byte{amlLEqualOp}, a...), b...)
}

// If encodes If(predicate){terms}.
func If(predicate []byte, terms ...[]byte) []byte {
	body := append([]byte(nil), predicate...)
	for _, t := range terms {
		body = append(body, t...)
	}
	return withPkg([]byte{amlIfOp}, body)
}

// Notify encodes Notify(target, value): target is a device's name path.
func Notify(target string, value uint64) []byte {
	return append(append([]byte{amlNotifyOp}, nameString(target)...), Integer(value)...)
}

// Resource descriptors for ResourceTemplate (ACPI 6.4 §6.4).

// ResourceTemplate wraps descriptors in a Buffer with an End Tag.
func ResourceTemplate(descs ...[]byte) []byte {
	var b []byte
	for _, d := range descs {
		b = append(b, d...)
	}
	// End tag; checksum 0 means "treat as valid".
	b = append(b, 0x79, 0x00)
	return Buffer(b)
}

// IOPort is a fixed 16-bit-decode I/O port descriptor.
func IOPort(min, max uint16, align, length uint8) []byte {
	b := []byte{0x47, 0x01}
	b = binary.LittleEndian.AppendUint16(b, min)
	b = binary.LittleEndian.AppendUint16(b, max)
	return append(b, align, length)
}

// Address space resource types.
const (
	resMemory = 0
	resIO     = 1
	resBus    = 2
	// General flags: producer, positive decode, min and max fixed.
	resFixed = 0x0c
)

// WordBusNumber describes a PCI bus number range.
func WordBusNumber(min, max uint16) []byte {
	return wordAddr(resBus, 0, min, max)
}

// WordIO describes an I/O window forwarded by a bridge.
func WordIO(min, max uint16) []byte {
	return wordAddr(resIO, 0x03, min, max) // EntireRange
}

func wordAddr(typ, tflags byte, min, max uint16) []byte {
	b := []byte{0x88, 13, 0, typ, resFixed, tflags}
	for _, v := range []uint16{0, min, max, 0, max - min + 1} {
		b = binary.LittleEndian.AppendUint16(b, v)
	}
	return b
}

// DWordMemory describes a 32-bit memory window (non-cacheable, read/write).
func DWordMemory(min, max uint32) []byte {
	b := []byte{0x87, 23, 0, resMemory, resFixed, 0x01}
	for _, v := range []uint32{0, min, max, 0, max - min + 1} {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	return b
}

// QWordMemory describes a 64-bit memory window.
func QWordMemory(min, max uint64) []byte {
	b := []byte{0x8a, 43, 0, resMemory, resFixed, 0x01}
	for _, v := range []uint64{0, min, max, 0, max - min + 1} {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return b
}

// Interrupt is an Extended Interrupt descriptor for one edge-triggered,
// active-high, exclusive interrupt consumed by the device (ISA style).
func Interrupt(gsi uint32) []byte {
	const consumer, edge = 1 << 0, 1 << 1
	b := []byte{0x89, 6, 0, consumer | edge, 1}
	return binary.LittleEndian.AppendUint32(b, gsi)
}
