package virtio

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/cube-runtime/cube/hypervisor/pci"
)

// Layout of BAR 0 of every virtio-pci device (64-bit memory BAR).
const (
	BARIndex     = 0
	CommonOffset = 0x0000
	ISROffset    = 0x1000
	DeviceOffset = 0x2000
	NotifyOffset = 0x3000
	// NotifyMultiplier: queue q's notify register is at NotifyOffset + 4*q.
	NotifyMultiplier = 4
	MSIXTableOffset  = 0x4000
	MSIXPBAOffset    = 0x6000
	BARSize          = 0x8000
	regionSize       = 0x1000
)

// Device status bits.
const (
	StatusAcknowledge = 1
	StatusDriver      = 2
	StatusDriverOK    = 4
	StatusFeaturesOK  = 8
	StatusNeedsReset  = 64
	StatusFailed      = 128
)

// virtio_pci_cap cfg_type values.
const (
	capCommon = 1
	capNotify = 2
	capISR    = 3
	capDevice = 4
	capPCI    = 5
)

// Common configuration register offsets.
const (
	ccDeviceFeatureSel = 0x00
	ccDeviceFeature    = 0x04
	ccDriverFeatureSel = 0x08
	ccDriverFeature    = 0x0C
	ccConfigMSIX       = 0x10
	ccNumQueues        = 0x12
	ccStatus           = 0x14
	ccConfigGen        = 0x15
	ccQueueSelect      = 0x16
	ccQueueSize        = 0x18
	ccQueueMSIX        = 0x1A
	ccQueueEnable      = 0x1C
	ccQueueNotifyOff   = 0x1E
	ccQueueDesc        = 0x20
	ccQueueDriver      = 0x28
	ccQueueDevice      = 0x30
	ccSize             = 0x38
)

// IRQLine is an optional legacy INTx line (used only when the guest does not
// enable MSI-X).
type IRQLine interface {
	SetLevel(high bool) error
}

// PCIOptions configure a virtio-pci transport.
type PCIOptions struct {
	Mem   Memory          // required
	Dirty DirtyTracker    // optional: records pages written by the device
	MSI   pci.MSISignaler // required for interrupts with MSI-X
	INTx  IRQLine         // optional
	// Class/Subclass of the PCI function (e.g. 0x01/0x80 storage, 0xFF/0x00 other).
	Class, Subclass uint8
}

// PCITransport is the virtio 1.x modern PCI transport for one device. It
// implements pci.Function.
type PCITransport struct {
	mu   sync.Mutex
	dev  Device
	cfg  *pci.Config
	msix *pci.MSIX
	mem  guestMem
	intx IRQLine

	queues       []*Queue
	offered      uint64
	driverFeat   uint64
	devFeatSel   uint32
	drvFeatSel   uint32
	queueSel     uint16
	status       uint8
	configVector atomic.Uint32
	configGen    atomic.Uint32
	needsReset   atomic.Bool
	isr          atomic.Uint32
	active       bool
	pciCapOff    int
	env          *Env

	// Pause/Resume: notifyMu is held shared while the device runs a kick, so
	// Pause can wait for in-flight kicks; kicks that arrive while paused are
	// remembered in pending and replayed by Resume.
	notifyMu sync.RWMutex
	paused   atomic.Bool
	pendMu   sync.Mutex
	pending  []bool
}

// Quiescer is implemented by devices that touch guest memory outside Notify
// (vsock's host-side goroutines). Pause must return once the device no longer
// writes guest memory or queues; Resume restarts it.
type Quiescer interface {
	Pause()
	Resume()
}

// NewPCI wraps dev in a virtio-pci transport.
func NewPCI(dev Device, opts PCIOptions) (*PCITransport, error) {
	if opts.Mem == nil {
		return nil, fmt.Errorf("virtio-pci: no guest memory")
	}
	sizes := dev.QueueSizes()
	if len(sizes) == 0 || len(sizes) > regionSize/NotifyMultiplier {
		return nil, fmt.Errorf("virtio-pci: %d queues", len(sizes))
	}
	t := &PCITransport{dev: dev, mem: guestMem{opts.Mem, opts.Dirty}, intx: opts.INTx, pending: make([]bool, len(sizes))}
	for i, s := range sizes {
		if s == 0 || s > MaxQueueSize || s&(s-1) != 0 {
			return nil, fmt.Errorf("virtio-pci: queue %d max size %d is not a power of two <= %d", i, s, MaxQueueSize)
		}
		q := NewQueue(s)
		q.mem = t.mem
		t.queues = append(t.queues, q)
	}
	t.offered = dev.Features() | FVersion1 | FRingIndirectDesc | FRingEventIdx
	pin := uint8(0)
	if opts.INTx != nil {
		pin = 1
	}
	id := dev.DeviceID()
	t.cfg = pci.NewConfig(pci.Header{
		VendorID: 0x1AF4, DeviceID: 0x1040 + id, Revision: 1,
		SubsysVendor: 0x1AF4, SubsysID: 0x40 + id,
		Class: opts.Class, Subclass: opts.Subclass, InterruptPin: pin,
	})
	if err := t.cfg.SetBAR(BARIndex, pci.BARInfo{Kind: pci.BARMem64, Size: BARSize}); err != nil {
		return nil, fmt.Errorf("virtio-pci: %w", err)
	}
	caps := []struct {
		typ       byte
		off, size uint32
		extra     []byte
	}{
		{capCommon, CommonOffset, ccSize, nil},
		{capNotify, NotifyOffset, uint32(len(sizes)) * NotifyMultiplier, le32(NotifyMultiplier)},
		{capISR, ISROffset, 1, nil},
		{capDevice, DeviceOffset, regionSize, nil},
	}
	for _, c := range caps {
		body := virtioCap(c.typ, BARIndex, c.off, c.size, c.extra)
		if _, err := t.cfg.AddCapability(pci.CapIDVendor, body, nil); err != nil {
			return nil, fmt.Errorf("virtio-pci: %w", err)
		}
	}
	// VIRTIO_PCI_CAP_PCI_CFG: a window into the BAR through config space. bar,
	// offset and length are guest-writable; pci_cfg_data is intercepted.
	body := virtioCap(capPCI, 0, 0, 0, make([]byte, 4))
	wr := make([]byte, len(body))
	wr[2] = 0xFF // bar
	for i := 6; i < 14; i++ {
		wr[i] = 0xFF // offset, length
	}
	off, err := t.cfg.AddCapability(pci.CapIDVendor, body, wr)
	if err != nil {
		return nil, fmt.Errorf("virtio-pci: %w", err)
	}
	t.pciCapOff = off
	// One vector per queue plus one for config changes.
	t.msix, err = pci.NewMSIX(t.cfg, len(sizes)+1, BARIndex, MSIXTableOffset, MSIXPBAOffset, opts.MSI)
	if err != nil {
		return nil, fmt.Errorf("virtio-pci: %w", err)
	}
	if t.msix.TableSize() > MSIXPBAOffset-MSIXTableOffset {
		return nil, fmt.Errorf("virtio-pci: msi-x table too large")
	}
	t.configVector.Store(NoVector)
	return t, nil
}

// virtioCap builds a virtio_pci_cap body (after cap_vndr and cap_next).
func virtioCap(typ byte, bar byte, off, length uint32, extra []byte) []byte {
	b := make([]byte, 14+len(extra))
	b[0] = byte(16 + len(extra)) // cap_len
	b[1] = typ
	b[2] = bar
	binary.LittleEndian.PutUint32(b[6:], off)
	binary.LittleEndian.PutUint32(b[10:], length)
	copy(b[14:], extra)
	return b
}

func le32(v uint32) []byte {
	b := make([]byte, 4)
	binary.LittleEndian.PutUint32(b, v)
	return b
}

// Config implements pci.Function.
func (t *PCITransport) Config() *pci.Config { return t.cfg }

// MSIX returns the function's MSI-X table (for irqfd routing by the VMM).
func (t *PCITransport) MSIX() *pci.MSIX { return t.msix }

// Device returns the wrapped device.
func (t *PCITransport) Device() Device { return t.dev }

// NotifyAddress returns the guest-physical address of queue q's notify
// register given the BAR's current base (for KVM_IOEVENTFD registration; any
// 2-byte write there means "queue q kicked").
func NotifyAddress(barBase uint64, q int) uint64 {
	return barBase + NotifyOffset + uint64(q)*NotifyMultiplier
}

// NumQueues returns the number of queues.
func (t *PCITransport) NumQueues() int { return len(t.queues) }

// NegotiatedFeatures returns the features the driver accepted.
func (t *PCITransport) NegotiatedFeatures() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.driverFeat
}

// Status returns the device status byte.
func (t *PCITransport) Status() uint8 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.statusLocked()
}

func (t *PCITransport) statusLocked() uint8 {
	s := t.status
	if t.needsReset.Load() {
		s |= StatusNeedsReset
	}
	return s
}

// ReadConfig implements pci.Function.
func (t *PCITransport) ReadConfig(off uint64, p []byte) {
	d := uint64(t.pciCapOff + 16)
	if off < d+4 && off+uint64(len(p)) > d && off >= d && len(p) <= 4 {
		bar, boff, blen := t.pciCfgWindow()
		if bar == BARIndex && int(blen) == len(p) && (blen == 1 || blen == 2 || blen == 4) && off == d {
			t.ReadBAR(BARIndex, uint64(boff), p)
			return
		}
		fill(p, 0)
		return
	}
	t.cfg.Read(off, p)
}

// WriteConfig implements pci.Function.
func (t *PCITransport) WriteConfig(off uint64, p []byte) {
	d := uint64(t.pciCapOff + 16)
	if off == d && len(p) <= 4 {
		bar, boff, blen := t.pciCfgWindow()
		if bar == BARIndex && int(blen) == len(p) && (blen == 1 || blen == 2 || blen == 4) {
			t.WriteBAR(BARIndex, uint64(boff), p)
		}
		return
	}
	t.cfg.Write(off, p)
	t.msix.ConfigWritten()
}

func (t *PCITransport) pciCfgWindow() (bar uint8, off, length uint32) {
	var b [12]byte
	t.cfg.Read(uint64(t.pciCapOff+4), b[:])
	return b[0], binary.LittleEndian.Uint32(b[4:]), binary.LittleEndian.Uint32(b[8:])
}

// ReadBAR implements pci.Function.
func (t *PCITransport) ReadBAR(bar int, off uint64, p []byte) {
	fill(p, 0)
	if bar != BARIndex || off >= BARSize || uint64(len(p)) > BARSize-off {
		return
	}
	switch {
	case off < ISROffset:
		t.readCommon(off, p)
	case off < DeviceOffset:
		if off == ISROffset && len(p) >= 1 {
			// Reading ISR acknowledges it and lowers INTx.
			p[0] = uint8(t.isr.Swap(0))
			if t.intx != nil {
				_ = t.intx.SetLevel(false)
			}
		}
	case off < NotifyOffset:
		t.dev.ReadConfig(off-DeviceOffset, p)
	case off < MSIXTableOffset:
		// Notify registers read as zero.
	case off < MSIXPBAOffset:
		t.msix.TableRead(off-MSIXTableOffset, p)
	default:
		t.msix.PBARead(off-MSIXPBAOffset, p)
	}
}

// WriteBAR implements pci.Function.
func (t *PCITransport) WriteBAR(bar int, off uint64, p []byte) {
	if bar != BARIndex || off >= BARSize || uint64(len(p)) > BARSize-off {
		return
	}
	switch {
	case off < ISROffset:
		t.writeCommon(off, p)
	case off < DeviceOffset:
		// ISR is read-only.
	case off < NotifyOffset:
		t.dev.WriteConfig(off-DeviceOffset, p)
	case off < MSIXTableOffset:
		q := (off - NotifyOffset) / NotifyMultiplier
		t.NotifyQueue(int(q))
	case off < MSIXPBAOffset:
		t.msix.TableWrite(off-MSIXTableOffset, p)
	default:
		// PBA is read-only.
	}
}

// NotifyQueue delivers a queue kick (from the notify register or an ioeventfd).
func (t *PCITransport) NotifyQueue(q int) {
	if q < 0 || q >= len(t.queues) {
		return
	}
	t.notifyMu.RLock()
	defer t.notifyMu.RUnlock()
	if t.paused.Load() {
		t.pendMu.Lock()
		t.pending[q] = true
		t.pendMu.Unlock()
		return
	}
	t.mu.Lock()
	ok := t.active && !t.needsReset.Load()
	t.mu.Unlock()
	// The device is called without the transport lock: it may signal
	// interrupts or NeedsReset from inside Notify.
	if ok {
		t.dev.Notify(q)
	}
}

// Pause stops queue processing for a snapshot: it waits for kicks in
// progress, defers new ones, and pauses a Quiescer device. After Pause
// returns the device does not write guest memory until Resume.
func (t *PCITransport) Pause() {
	if t.paused.Swap(true) {
		return
	}
	t.notifyMu.Lock() // waits for in-flight NotifyQueue calls
	t.notifyMu.Unlock()
	if q, ok := t.dev.(Quiescer); ok {
		q.Pause()
	}
}

// Paused reports whether the transport is paused.
func (t *PCITransport) Paused() bool { return t.paused.Load() }

// Resume restarts a paused transport and replays the kicks that arrived meanwhile.
func (t *PCITransport) Resume() {
	if !t.paused.Load() {
		return
	}
	if q, ok := t.dev.(Quiescer); ok {
		q.Resume()
	}
	t.paused.Store(false)
	t.pendMu.Lock()
	var kick []int
	for i, p := range t.pending {
		if p {
			kick = append(kick, i)
			t.pending[i] = false
		}
	}
	t.pendMu.Unlock()
	for _, q := range kick {
		t.NotifyQueue(q)
	}
}

// signal raises an interrupt on vector (MSI-X) or, with MSI-X off, sets the
// ISR queue bit and asserts INTx. Safe from any goroutine.
func (t *PCITransport) signal(vector uint16) { t.raise(vector, 1) }

func (t *PCITransport) raise(vector uint16, isrBit uint32) {
	ok, err := t.msix.Notify(vector)
	if err != nil {
		logger.WithError(err).Warn("virtio: msi delivery failed")
	}
	if ok {
		return
	}
	for {
		o := t.isr.Load()
		if t.isr.CompareAndSwap(o, o|isrBit) {
			break
		}
	}
	if t.intx != nil {
		if err := t.intx.SetLevel(true); err != nil {
			logger.WithError(err).Warn("virtio: intx assert failed")
		}
	}
}

func (t *PCITransport) configChanged() {
	t.configGen.Add(1)
	t.raise(uint16(t.configVector.Load()), 2)
}

func (t *PCITransport) setNeedsReset(err error) {
	logger.WithError(err).WithField("device", t.dev.DeviceID()).Warn("virtio: device needs reset")
	if !t.needsReset.Swap(true) {
		t.configChanged()
	}
}

func fill(p []byte, v byte) {
	for i := range p {
		p[i] = v
	}
}
