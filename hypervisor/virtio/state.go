package virtio

import (
	"fmt"

	"github.com/cube-runtime/cube/hypervisor/pci"
	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// TransportState is the serializable state of a virtio-pci transport: PCI
// config space (BAR addresses, command, MSI-X control), MSI-X table and PBA,
// feature negotiation, device status and every queue's ring addresses and
// indexes. The device's own state is saved separately by the device.
// Its json names are the snapshot format's: changing one is a snapshot.Version bump.
type TransportState struct {
	Version          uint32        `json:"Version"`
	DeviceID         uint16        `json:"DeviceID"`
	PCIConfig        []byte        `json:"PCIConfig"`
	MSIX             pci.MSIXState `json:"MSIX"`
	Status           uint8         `json:"Status"`
	NeedsReset       bool          `json:"NeedsReset"`
	DriverFeatures   uint64        `json:"DriverFeatures"`
	DeviceFeatureSel uint32        `json:"DeviceFeatureSel"`
	DriverFeatureSel uint32        `json:"DriverFeatureSel"`
	QueueSelect      uint16        `json:"QueueSelect"`
	ConfigVector     uint16        `json:"ConfigVector"`
	ConfigGeneration uint32        `json:"ConfigGeneration"`
	ISR              uint32        `json:"ISR"`
	Queues           []QueueState  `json:"Queues"`
}

// State captures the transport. Ordering: pause the vCPUs, then Pause the
// transport (stops the device writing guest memory), then State; memory is
// saved after this so it includes every used-ring write.
func (t *PCITransport) State() TransportState {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := TransportState{
		Version:          snapshot.Version,
		DeviceID:         t.dev.DeviceID(),
		PCIConfig:        t.cfg.Bytes(),
		MSIX:             t.msix.State(),
		Status:           t.status,
		NeedsReset:       t.needsReset.Load(),
		DriverFeatures:   t.driverFeat,
		DeviceFeatureSel: t.devFeatSel,
		DriverFeatureSel: t.drvFeatSel,
		QueueSelect:      t.queueSel,
		ConfigVector:     uint16(t.configVector.Load()),
		ConfigGeneration: t.configGen.Load(),
		ISR:              t.isr.Load(),
	}
	for _, q := range t.queues {
		s.Queues = append(s.Queues, q.QueueState)
	}
	return s
}

// Restore loads a transport state into a freshly constructed transport (same
// device type and queue layout). Ordering: restore the device's own state
// first; Restore re-activates the device when the saved status has DRIVER_OK
// and leaves the transport paused with every queue marked kicked, so Resume
// (called when the vCPUs resume) processes whatever the guest had queued.
func (t *PCITransport) Restore(s TransportState) error {
	if err := snapshot.CheckVersion("virtio-pci transport state", s.Version); err != nil {
		return fmt.Errorf("restore virtio-pci: %w", err)
	}
	if s.DeviceID != t.dev.DeviceID() {
		return fmt.Errorf("restore virtio-pci: state is for device id %d, device is %d", s.DeviceID, t.dev.DeviceID())
	}
	if len(s.Queues) != len(t.queues) {
		return fmt.Errorf("restore virtio-pci: %d queues in state, device has %d", len(s.Queues), len(t.queues))
	}
	if s.DriverFeatures&^t.offered != 0 {
		return fmt.Errorf("restore virtio-pci: negotiated features %#x not offered (%#x)", s.DriverFeatures, t.offered)
	}
	for i, qs := range s.Queues {
		q := Queue{MaxSize: t.queues[i].MaxSize, QueueState: qs}
		if qs.Ready {
			if err := q.Validate(); err != nil {
				return fmt.Errorf("restore virtio-pci: queue %d: %w", i, err)
			}
		}
	}
	t.Pause()
	t.pendMu.Lock()
	for i := range t.pending {
		t.pending[i] = s.Queues[i].Ready
	}
	t.pendMu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.active {
		t.dev.Reset()
		t.active = false
	}
	if err := t.cfg.Restore(s.PCIConfig); err != nil {
		return fmt.Errorf("restore virtio-pci: %w", err)
	}
	if err := t.msix.Restore(s.MSIX); err != nil {
		return fmt.Errorf("restore virtio-pci: %w", err)
	}
	for i, qs := range s.Queues {
		t.queues[i].QueueState = qs
		if int(qs.Vector) >= t.msix.Vectors() {
			t.queues[i].Vector = NoVector
		}
	}
	t.driverFeat = s.DriverFeatures
	t.devFeatSel, t.drvFeatSel, t.queueSel = s.DeviceFeatureSel, s.DriverFeatureSel, s.QueueSelect
	t.configVector.Store(uint32(t.vectorOK(s.ConfigVector)))
	t.configGen.Store(s.ConfigGeneration)
	t.isr.Store(s.ISR & 3)
	t.needsReset.Store(s.NeedsReset)
	t.status = s.Status &^ StatusNeedsReset
	if t.status&StatusDriverOK != 0 {
		if err := t.activateLocked(); err != nil {
			return fmt.Errorf("restore virtio-pci: %w", err)
		}
	}
	return nil
}

// Kind is the virtio-pci transport's kind (its state is the Transport of
// every device record).
const Kind = "virtio-pci"

// StateKind is virtio-pci's kind in a snapshot's device records.
func (t *PCITransport) StateKind() string { return Kind }

// SaveState returns the state (snapshot.Device).
func (t *PCITransport) SaveState() ([]byte, error) { return snapshot.Save(t.State()) }

// RestoreState loads a state SaveState returned (snapshot.Device).
func (t *PCITransport) RestoreState(b []byte) error {
	var s TransportState
	if err := snapshot.Load(b, &s); err != nil {
		return fmt.Errorf("restore virtio-pci: %w", err)
	}
	return t.Restore(s)
}
