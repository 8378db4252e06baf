// Package kvmtest runs tiny hand-assembled guests against a KVM device to
// prove that the device and our KVM layer work end to end. It is a normal
// package (not _test) so integration tests, e.g. inside the QEMU test host,
// can call Smoke on the nested /dev/kvm.
package kvmtest

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cube-runtime/cube/hypervisor/kvm"
)

// ErrNoKVM is wrapped by Smoke when the device file does not exist.
var ErrNoKVM = errors.New("kvm device not present")

// What the smoke guest does, and what Smoke checks.
const (
	SmokePort  = 0x10       // the guest OUTs SmokeByte here
	SmokeByte  = 0x42       // value of AL at the OUT
	SmokeAddr  = DataAddr   // guest-physical address the guest stores to
	SmokeValue = 0xCAFEF00D // 32-bit value stored there
)

// SmokeResult reports what the smoke guest did.
type SmokeResult struct {
	APIVersion  int
	MmapSize    int
	Exits       []kvm.ExitReason
	Port        uint16
	OutByte     byte
	MemoryWord  uint32
	FinalRIP    uint64
	MSRListSize int // entries in KVM_GET_MSR_INDEX_LIST
}

// smokeCode is the guest program, 64-bit mode, CPL0. It is four
// instructions on purpose: on PVM hosts every CPL0 instruction is emulated.
var smokeCode = []byte{
	0xb0, SmokeByte, // mov al, SmokeByte
	0xe6, SmokePort, // out SmokePort, al
	// mov dword [SmokeAddr], SmokeValue  (C7 /0, SIB absolute disp32)
	0xc7, 0x04, 0x25, 0x00, 0x80, 0x00, 0x00, 0x0d, 0xf0, 0xfe, 0xca,
	0xf4, // hlt
}

// Smoke opens devPath, runs the smoke guest to its OUT and its HLT, and
// checks the byte it sent and the word it stored.
func Smoke(devPath string) (*SmokeResult, error) {
	g, err := NewGuest(devPath, smokeCode, GuestOptions{})
	if err != nil {
		return nil, fmt.Errorf("smoke: %w", err)
	}
	defer g.Close()
	res := &SmokeResult{APIVersion: kvm.APIVersion, MmapSize: g.Sys.VCPUMmapSize()}
	msrs, err := g.Sys.MSRIndexList()
	if err != nil {
		return res, fmt.Errorf("smoke: %w", err)
	}
	res.MSRListSize = len(msrs)
	cpu, mem := g.CPU, g.Mem

	// First exit: the OUT.
	if err := runOnce(cpu, res); err != nil {
		return res, err
	}
	io, err := cpu.RunData().IO()
	if err != nil {
		return res, fmt.Errorf("smoke: first exit: %w", err)
	}
	if io.Direction != kvm.IODirOut || io.Port != SmokePort || io.Size != 1 || io.Count != 1 {
		return res, fmt.Errorf("smoke: first exit: want OUT of 1 byte to port %#x, got dir %d size %d count %d port %#x",
			SmokePort, io.Direction, io.Size, io.Count, io.Port)
	}
	res.Port, res.OutByte = io.Port, io.Data[0]
	if res.OutByte != SmokeByte {
		return res, fmt.Errorf("smoke: guest sent %#x to port %#x, want %#x", res.OutByte, io.Port, SmokeByte)
	}

	// Second exit: the HLT, after the store.
	if err := runOnce(cpu, res); err != nil {
		return res, err
	}
	if rs := cpu.RunData().ExitReason(); rs != kvm.ExitHLT {
		return res, fmt.Errorf("smoke: second exit is %v, want HLT", rs)
	}
	regs, err := cpu.GetRegs()
	if err != nil {
		return res, fmt.Errorf("smoke: %w", err)
	}
	res.FinalRIP = regs.RIP
	res.MemoryWord = binary.LittleEndian.Uint32(mem[SmokeAddr:])
	if res.MemoryWord != SmokeValue {
		return res, fmt.Errorf("smoke: guest memory at %#x holds %#x, want %#x", SmokeAddr, res.MemoryWord, uint32(SmokeValue))
	}
	if want := uint64(CodeAddr + len(smokeCode)); regs.RIP != want {
		return res, fmt.Errorf("smoke: rip after hlt is %#x, want %#x", regs.RIP, want)
	}
	return res, nil
}

// runOnce enters the guest, retrying EINTR (nothing kicks this vCPU, but a
// stray signal to the thread must not fail the smoke test), and turns fatal
// exits into errors.
func runOnce(cpu *kvm.VCPU, res *SmokeResult) error {
	for {
		err := cpu.Run()
		if errors.Is(err, kvm.ErrInterrupted) {
			continue
		}
		if err != nil {
			return fmt.Errorf("smoke: %w", err)
		}
		break
	}
	rd := cpu.RunData()
	res.Exits = append(res.Exits, rd.ExitReason())
	if err := rd.ExitError(); err != nil {
		regs, _ := cpu.GetRegs()
		return fmt.Errorf("smoke: guest stopped at rip %#x: %w", regs.RIP, err)
	}
	return nil
}
