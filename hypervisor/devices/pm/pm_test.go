package pm

import (
	"testing"

	"github.com/cube-runtime/cube/hypervisor/acpi"
)

func TestPowerOffAndReset(t *testing.T) {
	var off, reset int
	d := &Device{OnPowerOff: func() { off++ }, OnReset: func() { reset++ }}
	d.Write(0, []byte{acpi.SleepTypeS5 << 2}) // no SLP_EN
	d.Write(0, []byte{3<<2 | slpEn})          // S3: not ours
	d.Write(1, []byte{2})
	if off != 0 || reset != 0 {
		t.Fatalf("spurious: off %d reset %d", off, reset)
	}
	d.Write(0, []byte{acpi.S5Value})
	d.Write(1, []byte{ResetValue})
	if off != 1 || reset != 1 {
		t.Fatalf("off %d reset %d", off, reset)
	}
	d.Write(5, []byte{1})
	d.Write(0, nil)
	(&Device{}).Write(0, []byte{acpi.S5Value})
}
