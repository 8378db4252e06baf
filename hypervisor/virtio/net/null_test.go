package net_test

import (
	"bytes"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/cube-runtime/cube/hypervisor/virtio"
	vnet "github.com/cube-runtime/cube/hypervisor/virtio/net"
	"github.com/cube-runtime/cube/hypervisor/virtio/virtiotest"
)

// TestNullBackend: a device with no backend (cube-vmm -net none) offers
// what a device over a tap with IFF_VNET_HDR offers, so the guest
// negotiates every offload; its frames are dropped (each tx chain still
// comes back to the guest), nothing is received, and Close ends the receive
// goroutine (a Null holds no fd: nothing to leak).
func TestNullBackend(t *testing.T) {
	be := vnet.NewNull()
	dev, err := vnet.New(vnet.Options{MAC: testMAC, Backend: be})
	if err != nil {
		t.Fatal(err)
	}
	overTap := newDevice(t, testMAC, newFake(true, allOffloads))
	if dev.Features() != overTap.Features() {
		t.Errorf("features %#x, a device over a tap with every offload %#x", dev.Features(), overTap.Features())
	}
	d := virtiotest.NewDriver(t, dev, nil)
	if st := d.Init(allFeatures, 64); st != 0xF {
		t.Fatalf("status %#x", st)
	}
	if got := d.Tr.NegotiatedFeatures(); got != allFeatures {
		t.Errorf("negotiated %#x, want %#x", got, allFeatures)
	}
	if cfg := d.DeviceConfig(0, 8); !bytes.Equal(cfg[:6], testMAC[:]) || le16(cfg[6:]) != vnet.StatusLinkUp {
		t.Errorf("config %x, want mac %s and link up", cfg, testMAC)
	}
	g := &guest{t: t, d: d, dev: dev}
	g.postRx(4, 2048)
	for i := 0; i < 3; i++ {
		g.txFrame(vnet.Header{}, frame(100, byte(i)))
	}
	g.waitUsed(vnet.TxQueue, 3)
	time.Sleep(20 * time.Millisecond) // nothing arrives: no backend
	if u := d.PopUsed(vnet.RxQueue); len(u) != 0 {
		t.Errorf("rx used %+v from a null backend", u)
	}
	if s := dev.Stats(); s.TxFrames != 3 || s.RxFrames != 0 || s.TxErrors != 0 {
		t.Errorf("stats %+v", s)
	}
	if err := be.SetOffloads(vnet.TunFCsum | 0x100); err == nil {
		t.Error("an offload a tap does not take accepted")
	}
	done := make(chan error, 1)
	go func() { done <- dev.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("close: %v", err)
		}
	case <-time.After(wait):
		t.Fatal("Close did not end the receive goroutine")
	}
	if _, err := be.ReadFrame(make([]byte, 64)); !errors.Is(err, os.ErrClosed) {
		t.Errorf("read after close: %v", err)
	}
	if err := be.WriteFrame(frame(64, 0)); !errors.Is(err, os.ErrClosed) {
		t.Errorf("write after close: %v", err)
	}
	if err := be.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
}

// TestNullRestoreOntoTap is an automatic template's NIC: a guest that
// brought its driver up on a null backend is snapshotted and restored into
// a device over a tap (cube-vmm restore -net fd=N); the tap gets the
// guest's offloads and frames flow both ways. A tap without those offloads
// is refused.
func TestNullRestoreOntoTap(t *testing.T) {
	dev, err := vnet.New(vnet.Options{MAC: testMAC, Backend: vnet.NewNull()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	d := virtiotest.NewDriver(t, dev, nil)
	if st := d.Init(allFeatures, 64); st != 0xF {
		t.Fatalf("status %#x", st)
	}
	g := &guest{t: t, d: d, dev: dev}
	bufs := g.postRx(2, 4096)
	d.Tr.Pause()
	trState, devState := d.Tr.State(), must(dev.SaveState())
	if err := newDevice(t, testMAC, newFake(false, 0)).RestoreState(devState); err == nil {
		t.Error("restore onto a tap without the negotiated offloads accepted")
	}

	be := newFake(true, allOffloads)
	tapDev := newDevice(t, testMAC, be)
	tr, err := virtio.NewPCI(tapDev, virtio.PCIOptions{Mem: d.Mem, MSI: d.MSI, Class: 0x02})
	if err != nil {
		t.Fatal(err)
	}
	if err := tapDev.RestoreState(devState); err != nil {
		t.Fatal(err)
	}
	if err := tr.Restore(trState); err != nil {
		t.Fatal(err)
	}
	d.Swap(tr)
	tr.Resume()
	g.dev, g.be = tapDev, be
	if got := be.set; len(got) != 1 || got[0] != allOffloads {
		t.Errorf("restored tap offloads %#x, want [%#x]", got, allOffloads)
	}
	be.rx <- withHeader(vnet.Header{}, frame(1000, 7))
	u := g.waitUsed(vnet.RxQueue, 1)
	if !bytes.Equal(d.Mem.Bytes(bufs[uint32(u[0].ID)]+vnet.HeaderLen, 1000), frame(1000, 7)) {
		t.Errorf("rx after restore: used %+v", u)
	}
	g.txFrame(vnet.Header{}, frame(100, 8))
	g.waitUsed(vnet.TxQueue, 1)
	if sent := be.sent(); len(sent) != 1 || !bytes.Equal(sent[0][vnet.HeaderLen:], frame(100, 8)) {
		t.Errorf("tx after restore: %d frames", len(sent))
	}
}
