package net

// Deliver runs one frame (header first) through the receive path
// synchronously, as the receive goroutine does; false: it has to wait.
func (d *Device) Deliver(frame []byte) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.deliverLocked(frame)
}
