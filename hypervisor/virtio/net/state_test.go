package net_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/hypervisor/snapshot/snapshottest"
	"github.com/cube-runtime/cube/hypervisor/virtio"
	vnet "github.com/cube-runtime/cube/hypervisor/virtio/net"
)

// newDevice is a device with no driver over a fake backend.
func newDevice(t testing.TB, mac vnet.MAC, be *fake) *vnet.Device {
	t.Helper()
	d, err := vnet.New(vnet.Options{MAC: mac, Backend: be})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestState(t *testing.T) {
	g := newGuest(t, newFake(true, allOffloads), allFeatures)
	snapshottest.RoundTrip(t, vnet.Kind, g.dev, newDevice(t, testMAC, newFake(true, allOffloads)))
	if s := g.dev.State(); s.Features != allFeatures || !s.LinkUp || s.MAC != testMAC.String() {
		t.Errorf("state %+v", s)
	}
	snapshottest.Encoding(t, `{"Version":1,"MAC":"52:54:00:12:34:56","LinkUp":true,"Features":5100387235}`, &vnet.State{})
	snapshottest.Refusals(t, g.dev, `{"Version":2,"MAC":"52:54:00:12:34:56"}`)
	b, _ := g.dev.SaveState()
	// Another MAC: the guest has this one cached.
	if err := newDevice(t, vnet.MAC{2, 0, 0, 0, 0, 1}, newFake(true, allOffloads)).RestoreState(b); !errors.Is(err, snapshot.ErrMismatch) {
		t.Errorf("a state of another mac: %v, want ErrMismatch", err)
	}
	// A backend without the offloads the guest negotiated.
	if err := newDevice(t, testMAC, newFake(false, 0)).RestoreState(b); !errors.Is(err, snapshot.ErrMismatch) {
		t.Errorf("a state with offloads the backend lacks: %v, want ErrMismatch", err)
	}
	if err := g.dev.RestoreState([]byte(`{"Version":1,"MAC":"zz","LinkUp":true}`)); !errors.Is(err, snapshot.ErrCorrupt) {
		t.Errorf("a malformed mac: %v, want ErrCorrupt", err)
	}
}

// TestSnapshotRestore snapshots a running device whose receive waits for
// buffers (a frame needing three, two posted) and restores device and
// transport into new ones over the same guest memory, as a restore into a
// new VMM does: no buffer was in flight, the guest's posted buffers are
// used by the next frame, the new tap gets the guest's offloads, and
// transmit carries on.
func TestSnapshotRestore(t *testing.T) {
	g := newGuest(t, newFake(true, allOffloads), allFeatures)
	bufs := g.postRx(2, 2048)
	g.be.rx <- withHeader(vnet.Header{}, frame(5000, 1)) // lost with the old VMM
	g.txFrame(vnet.Header{}, frame(100, 2))
	g.waitUsed(vnet.TxQueue, 1)
	g.d.Tr.Pause()
	trState, devState := g.d.Tr.State(), must(g.dev.SaveState())
	if u := g.d.PopUsed(vnet.RxQueue); len(u) != 0 {
		t.Fatalf("rx used %+v before the snapshot", u)
	}

	be := newFake(true, allOffloads)
	dev := newDevice(t, testMAC, be)
	tr, err := virtio.NewPCI(dev, virtio.PCIOptions{Mem: g.d.Mem, MSI: g.d.MSI, Class: 0x02})
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.RestoreState(devState); err != nil {
		t.Fatal(err)
	}
	if err := tr.Restore(trState); err != nil {
		t.Fatal(err)
	}
	g.d.Swap(tr)
	tr.Resume()
	g.dev, g.be = dev, be
	if got := be.set; len(got) != 1 || got[0] != allOffloads {
		t.Errorf("restored tap offloads %#x, want [%#x]", got, allOffloads)
	}
	be.rx <- withHeader(vnet.Header{}, frame(1000, 3))
	u := g.waitUsed(vnet.RxQueue, 1)
	if u[0].ID != 0 || !bytes.Equal(g.d.Mem.Bytes(bufs[0]+vnet.HeaderLen, 1000), frame(1000, 3)) {
		t.Errorf("rx after restore: used %+v", u)
	}
	g.txFrame(vnet.Header{}, frame(100, 4))
	g.waitUsed(vnet.TxQueue, 1)
	if sent := be.sent(); len(sent) != 1 || !bytes.Equal(sent[0][vnet.HeaderLen:], frame(100, 4)) {
		t.Errorf("tx after restore: %d frames", len(sent))
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

func FuzzRestoreState(f *testing.F) {
	snapshottest.Fuzz(f, newDevice(f, testMAC, newFake(true, allOffloads)))
}
