package virtio_test

import (
	"testing"

	"github.com/cube-runtime/cube/hypervisor/snapshot/snapshottest"
	"github.com/cube-runtime/cube/hypervisor/virtio"
	"github.com/cube-runtime/cube/hypervisor/virtio/rng"
	"github.com/cube-runtime/cube/hypervisor/virtio/virtiotest"
)

// transportState is a virtio-rng transport's state in the version 1
// encoding: one queue, two MSI-X vectors.
const transportState = `{"Version":1,"DeviceID":4,"PCIConfig":"9BpEEAYAEAAAAAABAAAAAA==",` +
	`"MSIX":{"Version":1,"Enabled":true,"Masked":false,"Table":[{"AddrLo":4276092928,"AddrHi":0,"Data":256,"Control":0},` +
	`{"AddrLo":4276092928,"AddrHi":0,"Data":257,"Control":1}],"Pending":[0],"CapStart":64},` +
	`"Status":15,"NeedsReset":false,"DriverFeatures":4563402752,"DeviceFeatureSel":1,"DriverFeatureSel":1,` +
	`"QueueSelect":0,"ConfigVector":1,"ConfigGeneration":0,"ISR":0,` +
	`"Queues":[{"Size":16,"Ready":true,"Desc":4096,"Avail":4352,"Used":4416,"Vector":0,"LastAvail":1,"UsedIdx":1,"Signalled":1}]}`

func TestTransportState(t *testing.T) {
	d := ready(t, nil)
	buf := d.Alloc(8)
	d.AddChain(0, []virtiotest.Desc{{Addr: buf, Len: 8, Write: true}})
	d.Kick(0)
	d.PopUsed(0)
	to, err := virtio.NewPCI(rng.New(), virtio.PCIOptions{Mem: d.Mem, MSI: d.MSI, Class: 0xFF})
	if err != nil {
		t.Fatal(err)
	}
	snapshottest.RoundTrip(t, virtio.Kind, d.Tr, to)
	snapshottest.Encoding(t, transportState, &virtio.TransportState{})
	snapshottest.Refusals(t, to, `{"Version":2}`)
}

func FuzzTransportState(f *testing.F) {
	tr, err := virtio.NewPCI(rng.New(), virtio.PCIOptions{Mem: virtiotest.NewMemory(1 << 20), MSI: &virtiotest.MSIRecorder{}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte(transportState))
	snapshottest.Fuzz(f, tr)
}
