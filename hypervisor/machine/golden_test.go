package machine

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/devices/serial"
	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/hypervisor/snapshot/snapshottest"
	"github.com/cube-runtime/cube/hypervisor/virtio"
	"github.com/cube-runtime/cube/hypervisor/virtio/blk"
	"github.com/cube-runtime/cube/hypervisor/virtio/rng"
	"github.com/cube-runtime/cube/hypervisor/virtio/vsock"
)

// TestGoldenStates: every device state, transport state and the serial
// state in the golden snapshots decode into their devices' state structs
// and encode again to exactly their bytes (package snapshot's golden test
// does the same for the payload around them), and every vCPU's state goes
// through the KVM structs and back unchanged.
func TestGoldenStates(t *testing.T) {
	states := map[string]func() any{
		blk.Kind:   func() any { return new(blk.State) },
		vsock.Kind: func() any { return new(vsock.State) },
		rng.Kind:   func() any { return new(rng.State) },
	}
	for _, name := range []string{snapshottest.Full, snapshottest.Diff} {
		b, err := os.ReadFile(filepath.Join(snapshottest.VersionDir(snapshot.Version), name, snapshot.StateName))
		if err != nil {
			t.Fatal(err)
		}
		payload, err := snapshot.DecodeState(b)
		if err != nil {
			t.Fatal(err)
		}
		s, err := snapshot.DecodePayload(payload)
		if err != nil {
			t.Fatal(err)
		}
		reencodes(t, name+" serial", s.Serial, new(serial.State))
		for i, d := range s.Devices {
			newState, ok := states[d.Kind]
			if !ok {
				t.Fatalf("%s: device %d of kind %q: no state type for it here", name, i, d.Kind)
			}
			reencodes(t, name+" "+d.Kind+" transport", d.Transport, new(virtio.TransportState))
			reencodes(t, name+" "+d.Kind, d.State, newState())
		}
		for i, v := range s.VCPUs {
			back := snapshot.VCPU{ID: v.ID, XSave: v.XSave, TSCKHz: v.TSCKHz,
				CPUID: cpuidToSnap(cpuidToKVM(v.CPUID)), MPState: v.MPState, Regs: v.Regs,
				Sregs: sregsToSnap(sregsToKVM(v.Sregs)), XCRs: xcrsToSnap(xcrsToKVM(v.XCRs)), DebugRegs: v.DebugRegs,
				LAPIC: v.LAPIC, MSRs: msrsToSnap(msrsToKVM(v.MSRs)), Events: v.Events}
			if !reflect.DeepEqual(back, v) {
				t.Errorf("%s: vcpu %d changes through the KVM structs", name, i)
			}
		}
		for _, c := range []snapshot.IRQChip{s.PICMaster, s.PICSlave, s.IOAPIC} {
			if irqchipToSnap(irqchipToKVM(c)) != c {
				t.Errorf("%s: irqchip %d changes through the KVM struct", name, c.ChipID)
			}
		}
		if pitToSnap(pitToKVM(s.PIT)) != s.PIT {
			t.Errorf("%s: the PIT changes through the KVM struct", name)
		}
	}
}

func reencodes(t *testing.T, what string, b []byte, v any) {
	t.Helper()
	if err := snapshot.Load(b, v); err != nil {
		t.Fatalf("golden %s: %v", what, err)
	}
	again, err := snapshot.Save(v)
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(b) {
		t.Errorf("golden %s re-encodes as\n%s\nit is\n%s\n(changing a device state's encoding is a snapshot.Version bump)", what, again, b)
	}
}
