// Package pm is the hardware-reduced ACPI power-management device: the
// FADT's sleep control register (power-off when the guest enters S5) and
// reset register (reboot). See hypervisor/acpi for the tables that point
// the guest here.
package pm

// Port layout: sleep control/status at Base, reset register at Base+1.
const (
	Base       = 0x600
	Size       = 2
	SleepPort  = Base
	ResetPort  = Base + 1
	ResetValue = 1

	slpEn    = 1 << 5
	slpTypS5 = 5
)

// Device routes the guest's power requests to callbacks (called on a vCPU
// thread).
type Device struct {
	OnPowerOff func()
	OnReset    func()
}

// Read implements bus.Device. Sleep status reads 0: the guest never
// resumes from S5, so WAK_STS is never observed.
func (d *Device) Read(off uint64, data []byte) {
	for i := range data {
		data[i] = 0
	}
}

// Write implements bus.Device.
func (d *Device) Write(off uint64, data []byte) {
	if len(data) == 0 {
		return
	}
	v := data[0]
	switch off {
	case SleepPort - Base:
		// SLP_TYP is bits 4:2; only S5 (soft off) is advertised.
		if v&slpEn != 0 && (v>>2)&7 == slpTypS5 && d.OnPowerOff != nil {
			d.OnPowerOff()
		}
	case ResetPort - Base:
		if v == ResetValue && d.OnReset != nil {
			d.OnReset()
		}
	}
}
