package virtio_test

import (
	"encoding/binary"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/virtio"
	"github.com/cube-runtime/cube/hypervisor/virtio/rng"
	"github.com/cube-runtime/cube/hypervisor/virtio/virtiotest"
)

// FuzzTransportRegisters replays arbitrary register accesses against BAR 0
// (common config, ISR, device config, notify, MSI-X table and PBA) of a
// device whose rings point into random memory, and checks the status
// invariants a driver relies on.
func FuzzTransportRegisters(f *testing.F) {
	f.Add([]byte{0x14, 0x00, 1, 1, 0x14, 0x00, 1, 3, 0x14, 0x00, 1, 0xB, 0x1C, 0x00, 2, 1, 0x14, 0x00, 1, 0xF, 0x00, 0x30, 2, 0})
	f.Add([]byte{0x20, 0x00, 4, 0x10, 0x24, 0x00, 4, 0xFF, 0x1C, 0x00, 2, 1, 0x00, 0x40, 4, 0xFF})
	f.Add([]byte{0x0C, 0x00, 4, 0xFF, 0x08, 0x00, 4, 1, 0x0C, 0x00, 4, 1, 0x14, 0x00, 1, 0xFF})
	f.Fuzz(func(t *testing.T, ops []byte) {
		d := virtiotest.NewDriverSize(t, rng.New(), virtio.PCIOptions{}, 2<<20)
		d.Probe()
		for i := range d.Mem.Buf[:0x40000] {
			d.Mem.Buf[i] = byte(i * 131)
		}
		for len(ops) >= 4 {
			off := uint64(binary.LittleEndian.Uint16(ops[0:])) % virtio.BARSize
			n := []int{1, 2, 4, 8}[ops[2]%4]
			v := uint64(ops[3]) * 0x0101010101010101
			read := ops[2]&0x80 != 0
			ops = ops[4:]
			if off+uint64(n) > virtio.BARSize {
				continue
			}
			if read {
				d.Read(off, n)
			} else {
				d.Write(off, n, v)
			}
			st := d.Tr.Status()
			if st&virtio.StatusDriverOK != 0 && st&virtio.StatusFeaturesOK == 0 {
				t.Fatalf("DRIVER_OK without FEATURES_OK: %#x", st)
			}
			if st&virtio.StatusFeaturesOK != 0 && d.Tr.NegotiatedFeatures()&virtio.FVersion1 == 0 {
				t.Fatalf("FEATURES_OK without VERSION_1")
			}
		}
		// The state of whatever the fuzzer built always restores.
		s := d.Tr.State()
		tr, err := virtio.NewPCI(rng.New(), virtio.PCIOptions{Mem: d.Mem})
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Restore(s); err != nil && s.Status&virtio.StatusDriverOK == 0 {
			t.Fatalf("restore of a non-running device failed: %v", err)
		}
	})
}
