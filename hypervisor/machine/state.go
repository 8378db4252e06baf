package machine

import (
	"encoding/json"
	"fmt"
	"sort"

	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/hypervisor/kvm"
	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/hypervisor/virtio"
)

// The VM's state in a snapshot: captured in the freeze window, decoded and
// checked against the machine, loaded into the parked machine (restore and
// rollback).

const (
	msrIA32TSC         = 0x10
	msrIA32TSCDeadline = 0x6e0
)

// kindOf is the kind of state a virtio device saves.
func kindOf(d virtio.Device) string {
	if p, ok := d.(snapshot.Device); ok {
		return p.StateKind()
	}
	return fmt.Sprintf("unknown device %d", d.DeviceID())
}

// captureState reads all VM state. vCPUs are parked, transports paused.
func (m *Machine) captureState() (*snapshot.State, error) {
	s := &snapshot.State{Version: snapshot.Version}
	pit, err := m.vm.GetPIT2()
	if err != nil {
		return nil, err
	}
	clock, err := m.vm.GetClock()
	if err != nil {
		return nil, err
	}
	s.PIT, s.Clock = pitToSnap(pit), clockToSnap(clock)
	for _, c := range []struct {
		id  uint32
		dst *snapshot.IRQChip
	}{{kvm.IRQChipPICMaster, &s.PICMaster}, {kvm.IRQChipPICSlave, &s.PICSlave}, {kvm.IRQChipIOAPIC, &s.IOAPIC}} {
		chip, err := m.vm.GetIRQChip(c.id)
		if err != nil {
			return nil, err
		}
		*c.dst = irqchipToSnap(chip)
	}
	if m.snap.msrs == nil {
		if m.snap.msrs, err = m.readableMSRs(); err != nil {
			return nil, err
		}
	}
	for _, c := range m.cpus {
		vs, err := m.captureVCPU(c.CPU)
		if err != nil {
			return nil, fmt.Errorf("vcpu %d: %w", c.CPU.ID(), err)
		}
		s.VCPUs = append(s.VCPUs, vs)
	}
	if s.Serial, err = m.serial.SaveState(); err != nil {
		return nil, err
	}
	if m.genid != nil {
		if s.VMGenID, err = m.genid.SaveState(); err != nil {
			return nil, err
		}
	}
	for i, v := range m.virtio {
		d, ok := v.dev.(snapshot.Device)
		if !ok {
			return nil, fmt.Errorf("device %d cannot be snapshotted", v.dev.DeviceID())
		}
		ds := snapshot.DeviceState{Kind: d.StateKind()}
		if ds.Transport, err = v.tr.SaveState(); err != nil {
			return nil, fmt.Errorf("device %d: %w", i, err)
		}
		if ds.State, err = d.SaveState(); err != nil {
			return nil, fmt.Errorf("device %d: %w", i, err)
		}
		s.Devices = append(s.Devices, ds)
	}
	return s, nil
}

// readableMSRs is KVM's MSR index list less what this host cannot read,
// with TSC_DEADLINE moved after TSC: restore writes them in this order,
// and a deadline written before the TSC is relative to the wrong TSC.
func (m *Machine) readableMSRs() ([]uint32, error) {
	all, err := m.sys.MSRIndexList()
	if err != nil {
		return nil, err
	}
	cpu := m.cpus[0].CPU
	var ok []uint32
	if _, err := cpu.GetMSRs(all); err == nil {
		ok = all
	} else {
		for _, i := range all {
			if _, err := cpu.GetMSRs([]uint32{i}); err == nil {
				ok = append(ok, i)
			}
		}
	}
	ok = append([]uint32(nil), ok...)
	sort.SliceStable(ok, func(a, b int) bool { return ok[a] != msrIA32TSCDeadline && ok[b] == msrIA32TSCDeadline })
	return ok, nil
}

// captureVCPU saves one vCPU: MP_STATE first (it may flush pending APIC
// events into the other state), VCPU_EVENTS last.
func (m *Machine) captureVCPU(c *kvm.VCPU) (snapshot.VCPU, error) {
	v := snapshot.VCPU{ID: c.ID()}
	mp, err := c.GetMPState()
	if err != nil {
		return v, err
	}
	v.MPState = snapshot.MPState(mp)
	regs, err := c.GetRegs()
	if err != nil {
		return v, err
	}
	v.Regs = snapshot.Regs(regs)
	sregs, err := c.GetSregs()
	if err != nil {
		return v, err
	}
	v.Sregs = sregsToSnap(sregs)
	if sz, cerr := m.sys.CheckExtension(kvm.CapXSave2); cerr == nil && sz >= 4096 {
		if v.XSave, err = c.GetXSave2(sz); err != nil {
			return v, err
		}
	} else {
		x, err := c.GetXSave()
		if err != nil {
			return v, err
		}
		v.XSave = x.Region[:]
	}
	xcrs, err := c.GetXCRs()
	if err != nil {
		return v, err
	}
	v.XCRs = xcrsToSnap(xcrs)
	dr, err := c.GetDebugRegs()
	if err != nil {
		return v, err
	}
	v.DebugRegs = snapshot.DebugRegs(dr)
	lapic, err := c.GetLAPIC()
	if err != nil {
		return v, err
	}
	v.LAPIC = snapshot.LAPIC(lapic)
	msrs, err := c.GetMSRs(m.snap.msrs)
	if err != nil {
		return v, err
	}
	v.MSRs = msrsToSnap(msrs)
	cpuid, err := c.GetCPUID2()
	if err != nil {
		return v, err
	}
	v.CPUID = cpuidToSnap(cpuid)
	if khz, err := c.GetTSCKHz(); err == nil {
		v.TSCKHz = khz
	}
	ev, err := c.GetVCPUEvents()
	if err != nil {
		return v, err
	}
	v.Events = snapshot.VCPUEvents(ev)
	return v, nil
}

// restoreVCPU loads one vCPU in the documented order: CPUID2 → MP_STATE →
// REGS → SREGS → XSAVE → XCRS → DEBUGREGS → LAPIC (after SREGS, before
// MSRS) → MSRS (TSC_DEADLINE after TSC) → VCPU_EVENTS. setCPUID is false
// on rollback: KVM refuses to change CPUID after the vCPU ran, and the
// caller checked it is equal.
func restoreVCPU(c *kvm.VCPU, v *snapshot.VCPU, setCPUID bool, log *logrus.Entry) error {
	if setCPUID {
		if v.TSCKHz != 0 {
			if cur, err := c.GetTSCKHz(); err == nil && cur != v.TSCKHz {
				if err := c.SetTSCKHz(v.TSCKHz); err != nil {
					log.WithError(err).Warn("TSC frequency differs from the snapshot's and cannot be set")
				}
			}
		}
		if err := c.SetCPUID2(cpuidToKVM(v.CPUID)); err != nil {
			return fmt.Errorf("set cpuid: %w", err)
		}
	}
	if err := c.SetMPState(kvm.MPState(v.MPState)); err != nil {
		return err
	}
	if err := c.SetRegs(kvm.Regs(v.Regs)); err != nil {
		return err
	}
	if err := c.SetSregs(sregsToKVM(v.Sregs)); err != nil {
		return err
	}
	if err := c.SetXSave(v.XSave); err != nil {
		return err
	}
	if err := c.SetXCRs(xcrsToKVM(v.XCRs)); err != nil {
		return err
	}
	if err := c.SetDebugRegs(kvm.DebugRegs(v.DebugRegs)); err != nil {
		return err
	}
	if err := c.SetLAPIC(kvm.LAPICState(v.LAPIC)); err != nil {
		return err
	}
	if err := c.SetMSRs(msrsToKVM(v.MSRs)); err != nil {
		return err
	}
	if err := c.SetVCPUEvents(kvm.VCPUEvents(v.Events)); err != nil {
		return err
	}
	return nil
}

// restoreVM loads PIT, clock and irqchips (before the vCPUs, whose LAPICs
// deliver into them).
func (m *Machine) restoreVM(s *snapshot.State) error {
	if err := m.vm.SetPIT2(pitToKVM(s.PIT)); err != nil {
		return err
	}
	if err := m.vm.SetClock(kvm.ClockData{Clock: s.Clock.Clock}); err != nil {
		return err
	}
	for _, c := range []snapshot.IRQChip{s.PICMaster, s.PICSlave, s.IOAPIC} {
		if err := m.vm.SetIRQChip(irqchipToKVM(c)); err != nil {
			return err
		}
	}
	return nil
}

// restoreDevices loads each device's state, then its transport's (which
// re-activates a running device and leaves it paused), then rescans the
// PCI bus for BARs the guest moved, then resets vsock transports.
func (m *Machine) restoreDevices(s *snapshot.State) error {
	for i, v := range m.virtio {
		ds := &s.Devices[i]
		// checkState made sure the device persists itself, with this kind.
		if err := v.dev.(snapshot.Device).RestoreState(ds.State); err != nil {
			return fmt.Errorf("device %d: %w", i, err)
		}
		if err := v.tr.RestoreState(ds.Transport); err != nil {
			return fmt.Errorf("device %d: %w", i, err)
		}
	}
	if m.pci != nil {
		m.pci.Rescan()
	}
	for _, v := range m.virtio {
		if d, ok := v.dev.(transportResetter); ok {
			d.TransportReset()
		}
	}
	return nil
}

// transportResetter is a device whose guest driver must be told its
// connections are gone after a restore (virtio-vsock).
type transportResetter interface{ TransportReset() }

// decodeState parses and checks a state payload against this machine.
func (m *Machine) decodeState(payload []byte) (*snapshot.State, error) {
	s, err := snapshot.DecodePayload(payload)
	if err != nil {
		return nil, err
	}
	if err := m.checkState(s); err != nil {
		return nil, err
	}
	return s, nil
}

// checkState checks a decoded state against this machine's vCPUs and
// devices.
func (m *Machine) checkState(s *snapshot.State) error {
	if len(s.VCPUs) != len(m.cpus) {
		return fmt.Errorf("state has %d vCPUs, VM has %d: %w", len(s.VCPUs), len(m.cpus), snapshot.ErrMismatch)
	}
	for i, v := range s.VCPUs {
		if v.ID != m.cpus[i].CPU.ID() {
			return fmt.Errorf("state vCPU %d has id %d: %w", i, v.ID, snapshot.ErrCorrupt)
		}
	}
	if has := len(nonNull(s.VMGenID)) > 0; has != (m.genid != nil) {
		return fmt.Errorf("state has a VM generation id device: %v, this VM: %v (cube-vmm -vmgenid; a restore takes it from the snapshot): %w",
			has, m.genid != nil, snapshot.ErrMismatch)
	}
	if len(s.Devices) != len(m.virtio) {
		return fmt.Errorf("state has %d virtio devices, VM has %d: %w", len(s.Devices), len(m.virtio), snapshot.ErrMismatch)
	}
	for i, v := range m.virtio {
		if k := kindOf(v.dev); s.Devices[i].Kind != k {
			return fmt.Errorf("device %d: state is %s, VM has %s: %w", i, s.Devices[i].Kind, k, snapshot.ErrMismatch)
		}
		if err := m.checkRings(s.Devices[i].Transport); err != nil {
			return fmt.Errorf("device %d: %w", i, err)
		}
	}
	return nil
}

// checkRings refuses a transport state with a ready queue whose rings are
// not in guest RAM: a snapshot of a VM with more memory than this one, or
// a corrupt one. (The transport checks the rest of its state itself.)
func (m *Machine) checkRings(transport []byte) error {
	var ts virtio.TransportState
	if err := snapshot.Load(transport, &ts); err != nil {
		return fmt.Errorf("transport: %w", err)
	}
	for i, q := range ts.Queues {
		if !q.Ready {
			continue
		}
		n := uint64(q.Size)
		for _, r := range []struct {
			name     string
			gpa, len uint64
		}{{"descriptor", q.Desc, 16 * n}, {"available", q.Avail, 6 + 2*n}, {"used", q.Used, 6 + 8*n}} {
			if _, err := m.mem.Slice(r.gpa, r.len); err != nil {
				return fmt.Errorf("queue %d: %s ring at %#x+%d is not in guest RAM (%d MiB): %w",
					i, r.name, r.gpa, r.len, m.cfg.MemoryMiB, snapshot.ErrCorrupt)
			}
		}
	}
	return nil
}

// nonNull is a raw JSON value, or nil for JSON null.
func nonNull(r json.RawMessage) json.RawMessage {
	if string(r) == "null" {
		return nil
	}
	return r
}

// newGeneration gives a machine that may now run a second time from one
// state (a restore, a rollback) a new generation id and tells the guest,
// whose vmgenid driver then reseeds its CRNG: two VMs restored from one
// snapshot, or one VM rolled back, must not go on drawing the same random
// numbers. No-op without the device.
// Ordering: after the state is loaded (the irqchip must have the guest's
// routing for the interrupt, the LAPICs their state) and, on rollback,
// after the dirty record was taken, so that the id's page is in the next
// incremental snapshot; the vCPUs are parked.
func (m *Machine) newGeneration(why string) error {
	if m.genid == nil {
		return nil
	}
	if err := m.genid.NewGeneration(); err != nil {
		return fmt.Errorf("%s: %w", why, err)
	}
	m.log.WithFields(logrus.Fields{"id": m.genid.String(), "after": why}).Debug("new VM generation id")
	return nil
}

// applyState loads a decoded state into the parked machine.
func (m *Machine) applyState(s *snapshot.State, setCPUID bool) error {
	if err := m.restoreVM(s); err != nil {
		return err
	}
	m.steps.Mark("state.vm")
	for i, c := range m.cpus {
		if err := restoreVCPU(c.CPU, &s.VCPUs[i], setCPUID, m.log); err != nil {
			return fmt.Errorf("vcpu %d: %w", i, err)
		}
	}
	m.steps.Mark("state.vcpus")
	if err := m.serial.RestoreState(s.Serial); err != nil {
		return err
	}
	if m.genid != nil { // checkState made sure the state has one
		if err := m.genid.RestoreState(s.VMGenID); err != nil {
			return err
		}
	}
	defer m.steps.Mark("state.devices")
	return m.restoreDevices(s)
}
