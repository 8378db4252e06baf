package machine

import (
	"fmt"
	"math"

	"github.com/cube-runtime/cube/hypervisor/kvm"
	"github.com/cube-runtime/cube/hypervisor/pci"
	"github.com/cube-runtime/cube/hypervisor/virtio"
)

// PCI wiring. Bus 0 answers configuration mechanism #1 on ports 0xCF8–0xCFF and decodes memory BARs
// placed in the 32-bit window the DSDT's PCI0 advertises. Interrupts are MSI-X messages injected with
// KVM_SIGNAL_MSI; queue notifications arrive as MMIO exits on the notify region of BAR 0.

// pciPorts is the PIO face of the PCI bus (CONFIG_ADDRESS and CONFIG_DATA).
type pciPorts struct{ b *pci.Bus }

func (p pciPorts) Read(off uint64, data []byte) {
	if !p.b.PIORead(uint16(pci.PortConfigAddress+off), data) {
		fillOnes(data)
	}
}

func (p pciPorts) Write(off uint64, data []byte) {
	p.b.PIOWrite(uint16(pci.PortConfigAddress+off), data)
}

// pciWindow is the MMIO face of the PCI bus: BAR accesses in the window.
type pciWindow struct {
	b    *pci.Bus
	base uint64
}

func (w pciWindow) Read(off uint64, data []byte) {
	if !w.b.MMIORead(w.base+off, data) {
		fillOnes(data)
	}
}

func (w pciWindow) Write(off uint64, data []byte) { w.b.MMIOWrite(w.base+off, data) }

func fillOnes(p []byte) {
	for i := range p {
		p[i] = 0xff
	}
}

// guestRAM adapts guest memory to the devices' Memory interface (unsigned addresses).
type guestRAM struct{ m *Machine }

func (g guestRAM) ReadAt(p []byte, gpa uint64) (int, error) {
	if gpa > math.MaxInt64 {
		return 0, fmt.Errorf("guest address %#x out of range", gpa)
	}
	return g.m.mem.ReadAt(p, int64(gpa))
}

func (g guestRAM) WriteAt(p []byte, gpa uint64) (int, error) {
	if gpa > math.MaxInt64 {
		return 0, fmt.Errorf("guest address %#x out of range", gpa)
	}
	return g.m.mem.WriteAt(p, int64(gpa))
}

// msiInjector delivers MSI-X messages with KVM_SIGNAL_MSI.
type msiInjector struct{ vm *kvm.VM }

func (s msiInjector) SignalMSI(addr uint64, data uint32) error {
	return s.vm.SignalMSI(kvm.MSI{AddressLo: uint32(addr), AddressHi: uint32(addr >> 32), Data: data})
}

// pciBus returns the machine's PCI bus, creating and wiring it on first use.
func (m *Machine) pciBus() (*pci.Bus, error) {
	if m.pci != nil {
		return m.pci, nil
	}
	b := pci.NewBus(pci.Window{Base: PCIMMIO32Base, Size: PCIMMIO32Size}, pci.Window{})
	if err := m.pio.Register(pci.PortConfigAddress, 8, "pci config", pciPorts{b}); err != nil {
		return nil, fmt.Errorf("pci: %w", err)
	}
	if err := m.mmio.Register(PCIMMIO32Base, PCIMMIO32Size, "pci mmio32", pciWindow{b: b, base: PCIMMIO32Base}); err != nil {
		return nil, fmt.Errorf("pci: %w", err)
	}
	m.pci = b
	return b, nil
}

// AddVirtio puts dev on the PCI bus behind a virtio-pci transport. Call between New and Start. class and
// subclass are the PCI function's class code (e.g. 0x01/0x80 for storage, 0xff/0x00 for others).
func (m *Machine) AddVirtio(dev virtio.Device, class, subclass uint8) (*virtio.PCITransport, error) {
	m.mu.Lock()
	state := m.state
	m.mu.Unlock()
	if state != Created {
		return nil, fmt.Errorf("add virtio device %d: machine is %v (devices attach before Start)", dev.DeviceID(), state)
	}
	b, err := m.pciBus()
	if err != nil {
		return nil, err
	}
	t, err := virtio.NewPCI(dev, virtio.PCIOptions{
		Mem: guestRAM{m}, Dirty: m.mem, MSI: msiInjector{m.vm}, Class: class, Subclass: subclass,
	})
	if err != nil {
		return nil, fmt.Errorf("add virtio device %d: %w", dev.DeviceID(), err)
	}
	slot, err := b.Add(t)
	if err != nil {
		return nil, fmt.Errorf("add virtio device %d: %w", dev.DeviceID(), err)
	}
	m.virtio = append(m.virtio, virtioDev{dev: dev, tr: t})
	m.log.WithField("slot", slot).WithField("device", dev.DeviceID()).Debug("virtio device on pci bus 0")
	return t, nil
}
