package machine

import (
	"errors"
	"fmt"

	"github.com/cube-runtime/cube/hypervisor/kvm"
)

// PreparedVM is a KVM VM with its irqchip and PIT and nothing else: the part
// of a VM that does not depend on its shape, made before a snapshot to restore
// is known. It is used once (Config.Prepared) or closed.
type PreparedVM struct {
	sys *kvm.System
	vm  *kvm.VM
}

// PrepareVM makes a PreparedVM on cfg's KVM device.
func PrepareVM(cfg Config) (*PreparedVM, error) {
	cfg.Defaults()
	m := &Machine{cfg: cfg, log: cfg.Log}
	if err := m.createVM(); err != nil {
		m.release()
		return nil, err
	}
	return &PreparedVM{sys: m.sys, vm: m.vm}, nil
}

// Close releases an unused PreparedVM.
func (p *PreparedVM) Close() {
	if p.vm != nil {
		p.vm.Close()
	}
	if p.sys != nil {
		p.sys.Close()
	}
	p.vm, p.sys = nil, nil
}

// createVM opens KVM, checks the capabilities the machine needs, and creates the VM with its in-kernel
// irqchip and PIT: the part New and Restore share, before memory and vCPUs. A prepared VM is taken as is.
func (m *Machine) createVM() (err error) {
	if p := m.cfg.Prepared; p != nil {
		if p.vm == nil {
			return errors.New("prepared VM already used or closed")
		}
		m.sys, m.vm = p.sys, p.vm
		p.sys, p.vm = nil, nil // owned by the machine now
		return nil
	}
	if m.sys, err = kvm.Open(m.cfg.KVMDevice); err != nil {
		return err
	}
	for _, c := range []int{kvm.CapIRQChip, kvm.CapUserMemory, kvm.CapPIT2, kvm.CapIRQFD, kvm.CapIOEventFD, kvm.CapImmediateExit} {
		if n, err := m.sys.CheckExtension(c); err != nil || n == 0 {
			return fmt.Errorf("KVM lacks capability %d (needed)", c)
		}
	}
	m.steps.Mark("vm.open")
	if m.vm, err = m.sys.CreateVM(); err != nil {
		return err
	}
	m.steps.Mark("vm.create")
	// Intel VMX needs these two regions outside RAM; AMD ignores them.
	if err := m.vm.SetTSSAddr(tssAddr); err != nil {
		m.log.WithError(err).Debug("set TSS address")
	}
	if err := m.vm.SetIdentityMapAddr(identityMapAddr); err != nil {
		m.log.WithError(err).Debug("set identity map address")
	}
	// Exception payloads kept apart (as QEMU does): without this, reading
	// VCPU_EVENTS writes a pending #PF's address into CR2, so a snapshot
	// whose SREGS were read first saves a stale CR2 beside that #PF. Must
	// be enabled before any vCPU exists.
	if n, err := m.sys.CheckExtension(kvm.CapExceptionPayload); err == nil && n > 0 {
		if err := m.vm.EnableCap(kvm.EnableCap{Cap: kvm.CapExceptionPayload, Args: [4]uint64{1}}); err != nil {
			m.log.WithError(err).Warn("enable KVM exception payloads")
		}
	}
	// Ordering: the irqchip must exist before any vCPU; the PIT after it.
	if err = m.vm.CreateIRQChip(); err != nil {
		return err
	}
	m.steps.Mark("vm.irqchip")
	defer m.steps.Mark("vm.pit")
	return m.vm.CreatePIT2(kvm.PITSpeakerDummy)
}
