package virtio

import (
	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/hypervisor/pci"
)

var logger = logrus.WithField("component", "virtio")

// Virtio device IDs.
const (
	IDNet   = 1
	IDBlock = 2
	IDRNG   = 4
	IDVsock = 19
)

// Transport feature bits (the transport offers them for every device).
const (
	FRingIndirectDesc = 1 << 28
	FRingEventIdx     = 1 << 29
	FVersion1         = 1 << 32
)

// NoVector means "no MSI-X vector" in common config.
const NoVector = pci.NoVector

// Device is a virtio device behind a transport.
//
// Concurrency contract: the transport calls ReadConfig/WriteConfig/Notify from
// vCPU threads, possibly concurrently; the device serializes with its own lock.
// Between Activate and Reset the device owns the queues in Env exclusively.
// Reset must return only when the device no longer touches guest memory or
// queues (background goroutines stopped or fenced by the device lock).
type Device interface {
	// DeviceID is the virtio device ID (IDBlock, ...).
	DeviceID() uint16
	// Features are the device-specific feature bits offered (bits 0-23 and
	// any others the device implements); the transport adds its own.
	Features() uint64
	// QueueSizes gives the maximum size of each queue (powers of two).
	QueueSizes() []uint16
	// ReadConfig/WriteConfig access the device-specific configuration.
	ReadConfig(off uint64, p []byte)
	WriteConfig(off uint64, p []byte)
	// Activate starts the device after the driver set DRIVER_OK.
	Activate(env *Env) error
	// Notify tells the device the driver kicked queue q.
	Notify(q int)
	// Reset stops the device and returns it to its initial state.
	Reset()
}

// Env is what an activated device gets from its transport.
type Env struct {
	Queues   []*Queue
	Features uint64 // negotiated
	Mem      Memory
	Dirty    DirtyTracker

	signal      func(vector uint16)
	configIntr  func()
	needsResetF func(error)
}

// Used signals the driver about queue q's used ring if it asked for it. Call
// after one or more PushUsed on q (with the device lock held).
func (e *Env) Used(q int) {
	if q < 0 || q >= len(e.Queues) {
		return
	}
	if e.Queues[q].NeedsInterrupt() {
		e.signal(e.Queues[q].Vector)
	}
}

// ConfigChanged bumps the config generation and raises the config interrupt.
func (e *Env) ConfigChanged() { e.configIntr() }

// NeedsReset puts the device into DEVICE_NEEDS_RESET after a fatal driver
// error (corrupt ring) and tells the driver.
func (e *Env) NeedsReset(err error) { e.needsResetF(err) }

// HasFeature reports whether bit was negotiated.
func (e *Env) HasFeature(bit uint64) bool { return e.Features&bit != 0 }
