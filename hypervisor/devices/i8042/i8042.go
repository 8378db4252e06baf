// Package i8042 emulates the one thing we need from the PC keyboard
// controller: the CPU reset command (0xfe to port 0x64), which Linux uses
// for "reboot=k" and as a fallback reboot method. Everything else reads as
// an idle controller with no keyboard.
package i8042

// Ports: data at Base, command/status at Base+4.
const (
	Base = 0x60
	Size = 5

	offData    = 0
	offCommand = 4
	cmdReset   = 0xfe
)

// Device is the controller. OnReset is called (from a vCPU thread) when
// the guest pulses the reset line.
type Device struct {
	OnReset func()
}

// Read implements bus.Device: status 0 (nothing to read, ready for input).
func (d *Device) Read(off uint64, data []byte) {
	for i := range data {
		data[i] = 0
	}
}

// Write implements bus.Device.
func (d *Device) Write(off uint64, data []byte) {
	if off == offCommand && len(data) > 0 && data[0] == cmdReset && d.OnReset != nil {
		d.OnReset()
	}
}
