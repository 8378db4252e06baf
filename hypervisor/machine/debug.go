package machine

import (
	"encoding/binary"
	"fmt"
)

// VCPUDebug is a vCPU's execution state for diagnosing a guest that stopped
// answering: where it is, whether it can take interrupts, and what the local
// APIC holds (a vector stuck in service blocks every vector of its priority
// class and below; an empty timer means nothing will wake a halted vCPU).
type VCPUDebug struct {
	ID          int    `json:"id"`
	RIP         string `json:"rip"`
	RFLAGS      string `json:"rflags"`
	CR2         string `json:"cr2"` // the last page fault's address
	CR3         string `json:"cr3"`
	InterruptOK bool   `json:"if"`       // RFLAGS.IF
	MPState     uint32 `json:"mp_state"` // 0 runnable, 3 halted
	TPR         uint32 `json:"tpr"`
	ISR         []int  `json:"isr,omitempty"` // vectors in service
	IRR         []int  `json:"irr,omitempty"` // vectors requested
	LVTT        string `json:"lvtt"`
	TSCDeadline uint64 `json:"tsc_deadline"`
	TSC         uint64 `json:"tsc"`
	Injected    string `json:"injected,omitempty"` // an interrupt or exception KVM is about to inject
	Exits       uint64 `json:"exits"`
}

// DebugVCPUs parks the vCPUs for a moment, reads their state and lets them
// run again (a paused machine stays paused).
func (m *Machine) DebugVCPUs() ([]VCPUDebug, error) {
	m.ctl.Lock()
	defer m.ctl.Unlock()
	switch s := m.State(); s {
	case Running:
		m.cpus.Pause()
		defer func() {
			for _, c := range m.cpus {
				_ = c.CPU.KVMClockCtrl()
			}
			m.cpus.Resume()
		}()
	case Paused:
	default:
		return nil, fmt.Errorf("debug: machine is %v", s)
	}
	var out []VCPUDebug
	for _, v := range m.cpus {
		c := v.CPU
		d := VCPUDebug{ID: c.ID(), Exits: v.Exits.PIO.Load() + v.Exits.MMIO.Load() + v.Exits.Interrupted.Load() + v.Exits.Other.Load()}
		regs, err := c.GetRegs()
		if err != nil {
			return nil, fmt.Errorf("vcpu %d: %w", c.ID(), err)
		}
		d.RIP, d.RFLAGS, d.InterruptOK = fmt.Sprintf("%#x", regs.RIP), fmt.Sprintf("%#x", regs.RFLAGS), regs.RFLAGS&(1<<9) != 0
		// Events before SREGS: reading them delivers a pending #PF's address into CR2.
		if ev, err := c.GetVCPUEvents(); err == nil {
			if ev.Interrupt.Injected != 0 {
				d.Injected = fmt.Sprintf("interrupt %#x", ev.Interrupt.Nr)
			}
			if ev.Exception.Injected != 0 || ev.Exception.Pending != 0 {
				d.Injected += fmt.Sprintf(" exception %d error code %#x", ev.Exception.Nr, ev.Exception.ErrorCode)
			}
		}
		if sr, err := c.GetSregs(); err == nil {
			d.CR2, d.CR3 = fmt.Sprintf("%#x", sr.CR2), fmt.Sprintf("%#x", sr.CR3)
		}
		if mp, err := c.GetMPState(); err == nil {
			d.MPState = mp.MPState
		}
		if l, err := c.GetLAPIC(); err == nil {
			le := binary.LittleEndian
			d.TPR = le.Uint32(l.Regs[0x80:]) & 0xff
			d.ISR, d.IRR = apicVectors(l.Regs[:], 0x100), apicVectors(l.Regs[:], 0x200)
			d.LVTT = fmt.Sprintf("%#x", le.Uint32(l.Regs[0x320:]))
		}
		if ms, err := c.GetMSRs([]uint32{msrIA32TSC, msrIA32TSCDeadline}); err == nil && len(ms) == 2 {
			d.TSC, d.TSCDeadline = ms[0].Data, ms[1].Data
		}
		out = append(out, d)
	}
	return out, nil
}

// apicVectors lists the vectors set in the 256-bit APIC register array at
// off (eight 32-bit registers 16 bytes apart).
func apicVectors(regs []byte, off int) []int {
	var v []int
	for i := 0; i < 8; i++ {
		w := binary.LittleEndian.Uint32(regs[off+16*i:])
		for b := 0; b < 32; b++ {
			if w&(1<<b) != 0 {
				v = append(v, 32*i+b)
			}
		}
	}
	return v
}
