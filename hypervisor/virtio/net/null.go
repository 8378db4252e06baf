package net

import (
	"fmt"
	"os"
	"sync"
)

// NullOffloads are the TUN_F_* flags a Null backend takes: what every
// Linux tap with IFF_VNET_HDR takes (the first set newTap probes), so a
// guest that negotiated them against a Null device restores onto a real
// tap with the same features.
const NullOffloads = TunFCsum | TunFTSO4 | TunFTSO6 | TunFTSOECN

// Null is a Backend with nothing behind it (cube-vmm -net none): every
// transmitted frame is dropped, nothing is ever received, and it holds no
// file descriptor. It mimics a tap with IFF_VNET_HDR (the header and
// NullOffloads), so the device it backs offers the guest the features a tap
// device would: a VM snapshotted with it (an automatic template) restores
// with a real tap in its place (cube-vmm restore -net fd=N) and the guest's
// negotiated features are ones that tap offers. The link is up, as a NIC
// plugged into a switch with nothing else on it.
type Null struct {
	once   sync.Once
	closed chan struct{}
}

// NewNull returns a Null backend.
func NewNull() *Null { return &Null{closed: make(chan struct{})} }

// ReadFrame implements Backend: it blocks until Close, then fails.
func (n *Null) ReadFrame([]byte) (int, error) {
	<-n.closed
	return 0, os.ErrClosed
}

// WriteFrame implements Backend: the frame is dropped (the device counts
// it as sent, as a tap with no reader would).
func (n *Null) WriteFrame([]byte) error {
	select {
	case <-n.closed:
		return os.ErrClosed
	default:
		return nil
	}
}

// VnetHdr implements Backend.
func (n *Null) VnetHdr() bool { return true }

// Offloads implements Backend.
func (n *Null) Offloads() uint32 { return NullOffloads }

// SetOffloads implements Backend: it accepts what a tap would.
func (n *Null) SetOffloads(tun uint32) error {
	if tun&^NullOffloads != 0 {
		return fmt.Errorf("null backend: offloads %#x not supported (%#x)", tun, uint32(NullOffloads))
	}
	return nil
}

// Close implements Backend: it ends a blocked ReadFrame. Idempotent.
func (n *Null) Close() error {
	n.once.Do(func() { close(n.closed) })
	return nil
}
