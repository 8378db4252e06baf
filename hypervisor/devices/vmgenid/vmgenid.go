// Package vmgenid is the VM generation id device: 16 random bytes in
// guest memory that change whenever the VM may be running a second time
// from the same state (a restore, a clone, an in-place rollback), and an
// edge on a GSI that tells the guest to look. Linux's vmgenid driver
// (CONFIG_VMGENID) mixes the id into its RNG at probe and, when the id has
// changed on a notification, reseeds the CRNG at once, before any user
// space runs on the old state. The ACPI objects that describe it to the
// guest (\_SB.VGEN with ADDR, and the Generic Event Device that turns the
// GSI into Notify(VGEN, 0x80)) are built by hypervisor/acpi.
//
// The device keeps the id it last wrote: it is the device's snapshot state,
// beside the address and GSI the guest's tables name.
package vmgenid

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"sync"
)

// Size is the length of the generation id.
const Size = 16

// GSI is the interrupt the Generic Event Device owns: free on our machine
// (COM1 has 4; PCI devices use MSI-X).
const GSI = 5

// Memory is guest memory, where the id lives (memory.Memory). A write
// must be recorded for incremental snapshots (memory.Memory.WriteAt is).
type Memory interface {
	WriteAt(p []byte, gpa int64) (int, error)
}

// Options build a device.
type Options struct {
	Mem Memory
	// Addr is the id's guest-physical address, in memory the e820 map
	// reserves; GSI is the Generic Event Device's interrupt.
	Addr uint64
	GSI  uint32
	// Raise pulses the GSI (high, then low: the GED's interrupt is
	// edge-triggered).
	Raise func(gsi uint32) error
	// Rand is the source of new ids (default crypto/rand).
	Rand io.Reader
}

// Device is one VM's generation id.
type Device struct {
	opt Options
	mu  sync.Mutex
	id  [Size]byte
}

// New makes the device; the id is all zero until Generate.
func New(opt Options) (*Device, error) {
	if opt.Mem == nil || opt.Raise == nil {
		return nil, fmt.Errorf("vmgenid: guest memory and an interrupt are required")
	}
	if opt.Addr == 0 || opt.Addr%8 != 0 {
		return nil, fmt.Errorf("vmgenid: id address %#x is not a non-zero multiple of 8", opt.Addr)
	}
	if opt.Rand == nil {
		opt.Rand = rand.Reader
	}
	return &Device{opt: opt}, nil
}

// Addr is where the id lives in guest memory.
func (d *Device) Addr() uint64 { return d.opt.Addr }

// GSI is the interrupt that notifies the guest.
func (d *Device) GSI() uint32 { return d.opt.GSI }

// ID is the id the device last wrote or was restored with.
func (d *Device) ID() [Size]byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.id
}

// Generate writes a new random id into guest memory without telling the
// guest: at boot, before the guest's driver first reads it.
func (d *Device) Generate() error {
	var id [Size]byte
	if _, err := io.ReadFull(d.opt.Rand, id[:]); err != nil {
		return fmt.Errorf("vmgenid: new id: %w", err)
	}
	if _, err := d.opt.Mem.WriteAt(id[:], int64(d.opt.Addr)); err != nil {
		return fmt.Errorf("vmgenid: write id at %#x: %w", d.opt.Addr, err)
	}
	d.mu.Lock()
	d.id = id
	d.mu.Unlock()
	return nil
}

// NewGeneration writes a new id and notifies the guest. Call it with the
// vCPUs parked and the irqchip state loaded (the interrupt is delivered
// when they run).
// Ordering: the id is in guest memory before the interrupt is raised: the
// guest reads it in the notification's handler.
func (d *Device) NewGeneration() error {
	if err := d.Generate(); err != nil {
		return err
	}
	if err := d.opt.Raise(d.opt.GSI); err != nil {
		return fmt.Errorf("vmgenid: notify on GSI %d: %w", d.opt.GSI, err)
	}
	return nil
}

// String is the id in hex, for logs.
func (d *Device) String() string {
	id := d.ID()
	return hex.EncodeToString(id[:])
}
