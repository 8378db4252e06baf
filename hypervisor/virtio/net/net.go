// Package net is virtio-net (device id 1) with a TAP backend: one rx/tx
// queue pair, the MAC address and link status in config space, and the
// checksum and TCP segmentation offloads the guest and the tap both take,
// carried in the 12-byte virtio_net_hdr_v1 that the tap reads and writes
// itself (IFF_VNET_HDR). Received frames may span several rx chains
// (VIRTIO_NET_F_MRG_RXBUF).
//
// Everything in a descriptor chain is untrusted: a chain that is malformed,
// too short for the header, too long for a frame, or has descriptors of the
// wrong direction is returned to the guest unused and counted (Stats); a
// header asking for an offload that was not negotiated drops the frame.
//
// Transmit runs on the vCPU thread inside Notify (one write(2) per frame);
// receive runs on the device's own goroutine, which reads one frame at a
// time from the backend and waits, holding it, until the guest has posted
// enough buffers (the tap's own queue absorbs bursts meanwhile).
package net

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/hypervisor/virtio"
)

// Queues.
const (
	RxQueue   = 0
	TxQueue   = 1
	QueueSize = 256
)

// Config space (struct virtio_net_config): mac[6], status le16.
const (
	configSize = 8
	// StatusLinkUp is VIRTIO_NET_S_LINK_UP.
	StatusLinkUp = 1
)

var log = logrus.WithField("component", "virtio-net")

// Backend is the host side of the device: a TAP, or a fake in tests. Every
// read and every write is one whole Ethernet frame, preceded by the 12-byte
// virtio_net_hdr_v1 when VnetHdr is true.
type Backend interface {
	// ReadFrame reads the next frame into p, blocking until one arrives;
	// after Close it fails (os.ErrClosed). A frame longer than p is cut.
	ReadFrame(p []byte) (int, error)
	// WriteFrame writes one frame.
	WriteFrame(p []byte) error
	// VnetHdr reports whether frames carry the header. Without it the
	// device offers no offloads and adds or strips the header itself.
	VnetHdr() bool
	// Offloads are the TUN_F_* flags SetOffloads accepts.
	Offloads() uint32
	// SetOffloads says which offloaded frames the guest takes (TUN_F_*):
	// the backend must hand ReadFrame no other kind.
	SetOffloads(tun uint32) error
	// Close releases the backend and ends a blocked ReadFrame.
	Close() error
}

// Options configure a device.
type Options struct {
	MAC     MAC     // required: a unicast address (see ParseMAC, RandomMAC)
	Backend Backend // required; the device owns it (Close closes it)
}

// Stats counts frames and what was refused. Every chain the guest posts
// comes back to it: a refused one with used length 0.
type Stats struct {
	TxFrames, TxBytes uint64
	TxBadChain        uint64 // malformed chain, writable descriptor, shorter than the header, longer than a frame, outside RAM
	TxBadHeader       uint64 // offload not negotiated, checksum beyond the frame
	TxErrors          uint64 // the backend refused the frame
	RxFrames, RxBytes uint64
	RxBadChain        uint64 // malformed chain, readable descriptor, outside RAM
	RxBadHeader       uint64 // the backend handed us an offload the guest did not negotiate
	RxDropped         uint64 // no driver, or the frame is larger than every buffer the guest posted
	RxErrors          uint64 // the backend failed a read
}

type counters struct {
	txFrames, txBytes, txBadChain, txBadHeader, txErrors         atomic.Uint64
	rxFrames, rxBytes, rxBadChain, rxBadHeader, rxDropped, rxErr atomic.Uint64
}

// Device is a virtio-net device.
type Device struct {
	backend  Backend
	mac      MAC
	features uint64 // offered, device-specific bits

	// txMu serializes transmit (and owns txBuf); mu guards the rest. Lock
	// order: txMu, then mu.
	txMu  sync.Mutex
	txBuf []byte

	mu         sync.Mutex
	cond       *sync.Cond // on mu: the rx goroutine waits for buffers, Resume, Close
	env        *virtio.Env
	negotiated uint64 // the driver's features while active (or restored)
	linkUp     bool
	paused     bool // snapshot in progress: no guest memory access
	broken     bool // the rx ring was corrupt: drop frames until a reset
	closed     bool
	wg         sync.WaitGroup

	stats counters
}

// New makes a device over opts.Backend and starts its receive goroutine.
func New(opts Options) (*Device, error) {
	if opts.Backend == nil {
		return nil, errors.New("virtio-net: no backend")
	}
	if err := opts.MAC.check(); err != nil {
		return nil, fmt.Errorf("virtio-net: %w", err)
	}
	d := &Device{backend: opts.Backend, mac: opts.MAC, linkUp: true,
		txBuf:    make([]byte, HeaderLen+MaxPacket),
		features: FMAC | FStatus | FMrgRxbuf}
	if opts.Backend.VnetHdr() {
		// The tap takes checksum-offloaded and TSO frames from us whatever
		// TUNSETOFFLOAD says (that only governs what it hands us).
		d.features |= FCsum | FHostTSO4 | FHostTSO6 | FHostECN
		d.features |= guestFeatures(opts.Backend.Offloads())
	}
	d.cond = sync.NewCond(&d.mu)
	d.wg.Add(1)
	go d.rxLoop()
	return d, nil
}

// Close stops the device's goroutine and closes the backend.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.env = nil
	d.cond.Broadcast()
	d.mu.Unlock()
	err := d.backend.Close()
	d.wg.Wait()
	return err
}

func (d *Device) DeviceID() uint16     { return virtio.IDNet }
func (d *Device) Features() uint64     { return d.features }
func (d *Device) QueueSizes() []uint16 { return []uint16{QueueSize, QueueSize} }

// MAC returns the device's address.
func (d *Device) MAC() MAC { return d.mac }

// Stats returns the counters.
func (d *Device) Stats() Stats {
	c := &d.stats
	return Stats{
		TxFrames: c.txFrames.Load(), TxBytes: c.txBytes.Load(), TxBadChain: c.txBadChain.Load(),
		TxBadHeader: c.txBadHeader.Load(), TxErrors: c.txErrors.Load(),
		RxFrames: c.rxFrames.Load(), RxBytes: c.rxBytes.Load(), RxBadChain: c.rxBadChain.Load(),
		RxBadHeader: c.rxBadHeader.Load(), RxDropped: c.rxDropped.Load(), RxErrors: c.rxErr.Load(),
	}
}

// ReadConfig serves struct virtio_net_config { u8 mac[6]; le16 status; }.
func (d *Device) ReadConfig(off uint64, p []byte) {
	var cfg [configSize]byte
	copy(cfg[:], d.mac[:])
	d.mu.Lock()
	if d.linkUp {
		binary.LittleEndian.PutUint16(cfg[6:], StatusLinkUp)
	}
	d.mu.Unlock()
	clear(p)
	if off < configSize {
		copy(p, cfg[off:])
	}
}

// WriteConfig ignores writes: with VERSION_1 the MAC is read-only.
func (d *Device) WriteConfig(uint64, []byte) {}

// Activate implements virtio.Device: the tap is told which offloaded frames
// the guest takes.
func (d *Device) Activate(env *virtio.Env) error {
	d.txMu.Lock()
	defer d.txMu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errors.New("virtio-net: device closed")
	}
	if env.Features&^(d.features|virtio.FVersion1|virtio.FRingIndirectDesc|virtio.FRingEventIdx) != 0 {
		return fmt.Errorf("virtio-net: negotiated features %#x not offered", env.Features)
	}
	if d.backend.VnetHdr() {
		if err := d.backend.SetOffloads(TunOffloads(env.Features)); err != nil {
			return fmt.Errorf("virtio-net: set tap offloads %#x: %w", TunOffloads(env.Features), err)
		}
	}
	d.env = env
	d.negotiated = env.Features
	d.broken = false
	d.cond.Broadcast()
	return nil
}

// Reset implements virtio.Device. It returns once transmit and receive no
// longer touch the queues.
func (d *Device) Reset() {
	d.txMu.Lock()
	defer d.txMu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.env = nil
	d.negotiated = 0
	d.broken = false
}

// Pause implements virtio.Quiescer: the receive goroutine keeps the frame it
// holds and writes no guest memory until Resume. (Transmit runs inside
// Notify, which the transport has stopped.)
func (d *Device) Pause() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.paused = true
}

// Resume implements virtio.Quiescer.
func (d *Device) Resume() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.paused = false
	d.cond.Broadcast()
}

// Notify implements virtio.Device.
func (d *Device) Notify(q int) {
	switch q {
	case TxQueue:
		d.processTx()
	case RxQueue:
		// New buffers: the receive goroutine may be waiting for them.
		d.mu.Lock()
		d.cond.Broadcast()
		d.mu.Unlock()
	}
}

// processTx sends every frame the guest queued.
func (d *Device) processTx() {
	d.txMu.Lock()
	defer d.txMu.Unlock()
	d.mu.Lock()
	env, paused := d.env, d.paused
	d.mu.Unlock()
	if env == nil || paused {
		return
	}
	q := env.Queues[TxQueue]
	sent := false
	for {
		before := q.LastAvail
		c, err := q.Pop()
		if err != nil {
			env.NeedsReset(fmt.Errorf("virtio-net tx: %w", err))
			return
		}
		if skipped := q.LastAvail - before; skipped > 1 || (c == nil && skipped > 0) {
			// Pop returned malformed chains to the guest itself.
			d.stats.txBadChain.Add(uint64(skipped) - uint64(boolInt(c != nil)))
			sent = true
		}
		if c == nil {
			break
		}
		d.transmit(c, env.Features)
		if err := q.PushUsed(c.Head, 0); err != nil {
			env.NeedsReset(fmt.Errorf("virtio-net tx: %w", err))
			return
		}
		sent = true
	}
	if sent {
		env.Used(TxQueue)
	}
}

// transmit checks one tx chain and hands its frame to the backend; a
// refused frame is counted.
func (d *Device) transmit(c *virtio.Chain, features uint64) {
	total := c.ReadableLen()
	if len(c.Writable) > 0 || total < HeaderLen || total > HeaderLen+MaxPacket {
		d.stats.txBadChain.Add(1)
		log.WithField("len", total).WithField("writable", len(c.Writable)).Debug("virtio-net: dropping malformed tx chain")
		return
	}
	buf := d.txBuf[:total]
	if _, err := io.ReadFull(c.Reader(), buf); err != nil {
		d.stats.txBadChain.Add(1)
		log.WithError(err).Debug("virtio-net: tx chain outside guest memory")
		return
	}
	h, _ := ParseHeader(buf)
	h, err := CheckTx(h, len(buf)-HeaderLen, features)
	if err != nil {
		d.stats.txBadHeader.Add(1)
		log.WithError(err).Debug("virtio-net: dropping tx frame")
		return
	}
	frame := buf
	if d.backend.VnetHdr() {
		h.Encode(buf)
	} else {
		frame = buf[HeaderLen:]
	}
	if err := d.backend.WriteFrame(frame); err != nil {
		d.stats.txErrors.Add(1)
		log.WithError(err).Debug("virtio-net: backend refused a tx frame")
		return
	}
	d.stats.txFrames.Add(1)
	d.stats.txBytes.Add(uint64(len(buf) - HeaderLen))
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
