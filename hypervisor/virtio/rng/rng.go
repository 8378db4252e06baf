// Package rng is virtio-rng (entropy device): every writable buffer the guest
// offers is filled from crypto/rand.
package rng

import (
	"crypto/rand"
	"fmt"
	"io"
	"sync"

	"github.com/cube-runtime/cube/hypervisor/virtio"
)

// QueueSize is the request queue's maximum size.
const QueueSize = 256

// maxRequest caps the bytes served per request; Linux asks for at most a page
// or so, and a huge buffer must not make us burn CPU on crypto/rand.
const maxRequest = 64 << 10

// Device is a virtio-rng device.
type Device struct {
	mu     sync.Mutex
	env    *virtio.Env
	source io.Reader
}

// New returns a virtio-rng device reading from crypto/rand.
func New() *Device { return &Device{source: rand.Reader} }

func (d *Device) DeviceID() uint16              { return virtio.IDRNG }
func (d *Device) Features() uint64              { return 0 }
func (d *Device) QueueSizes() []uint16          { return []uint16{QueueSize} }
func (d *Device) ReadConfig(_ uint64, p []byte) { clear(p) }
func (d *Device) WriteConfig(uint64, []byte)    {}

// Activate implements virtio.Device.
func (d *Device) Activate(env *virtio.Env) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.env = env
	return nil
}

// Reset implements virtio.Device.
func (d *Device) Reset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.env = nil
}

// Notify fills every pending request.
func (d *Device) Notify(q int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.env == nil || q != 0 {
		return
	}
	queue := d.env.Queues[0]
	buf := make([]byte, 4096)
	served := false
	for {
		c, err := queue.Pop()
		if err != nil {
			d.env.NeedsReset(fmt.Errorf("virtio-rng: %w", err))
			return
		}
		if c == nil {
			break
		}
		w := c.Writer()
		want := min(w.Remaining(), maxRequest)
		for want > 0 {
			n := min(want, uint64(len(buf)))
			if _, err := io.ReadFull(d.source, buf[:n]); err != nil {
				break
			}
			if _, err := w.Write(buf[:n]); err != nil {
				// A buffer outside guest RAM: complete with what was written.
				break
			}
			want -= n
		}
		if err := queue.PushUsed(c.Head, uint32(w.Written())); err != nil {
			d.env.NeedsReset(fmt.Errorf("virtio-rng: %w", err))
			return
		}
		served = true
	}
	if served {
		d.env.Used(0)
	}
}
