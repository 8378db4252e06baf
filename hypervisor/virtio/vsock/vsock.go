// Package vsock is virtio-vsock with Firecracker's "hybrid" host side: no
// vhost, the VMM terminates the guest's stream connections itself.
//
//   - Host → guest: a host process connects to the Unix socket at UDSPath and
//     writes "CONNECT <port>\n"; when the guest accepts on <port> the device
//     answers "OK <hostport>\n" and the socket carries the stream
//     (hypervisor/vsockdial is that host side).
//   - Guest → host: a guest connect to CID 2 port P is forwarded to the Unix
//     socket "<UDSPath>_<P>"; if nothing listens there the guest gets a reset.
//
// TransportReset (after a snapshot restore) drops every connection and tells
// the guest with VIRTIO_VSOCK_EVENT_TRANSPORT_RESET; the listener survives.
package vsock

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/hypervisor/virtio"
)

// Queues.
const (
	RxQueue    = 0
	TxQueue    = 1
	EventQueue = 2
	QueueSize  = 256
)

// HostCID is the host's well-known CID.
const HostCID = 2

// Tunables.
const (
	// BufAlloc is the receive buffer we advertise per connection: the guest
	// may have this many bytes in flight towards the host.
	BufAlloc = 256 << 10
	// MaxPayload bounds one packet (Linux's VIRTIO_VSOCK_MAX_PKT_BUF_SIZE).
	MaxPayload = 64 << 10
	// maxCtrl bounds queued control packets (RST floods from a hostile guest).
	maxCtrl = 1024
	// MaxConns bounds open connections (each holds a host socket and up to
	// BufAlloc of buffer in each direction).
	MaxConns = 1024
	// HandshakeTimeout bounds reading the host's CONNECT line.
	HandshakeTimeout = 5 * time.Second
	// ConnectTimeout bounds waiting for the guest's answer to a host connect
	// and dialing a host listener for a guest connect.
	ConnectTimeout = 2 * time.Second
	// firstHostPort is where host-side ports of host-initiated connections start.
	firstHostPort       = 1 << 30
	eventTransportReset = 0
)

var log = logrus.WithField("component", "virtio-vsock")

// Options configure the device.
type Options struct {
	GuestCID uint64 // >= 3
	UDSPath  string // Unix socket the device listens on
}

type connKey struct{ local, peer uint32 }

type connState int

const (
	stConnecting connState = iota // guest REQUEST received, dialing the host listener
	stAwaiting                    // host CONNECT: REQUEST sent to the guest
	stEstablished
)

type conn struct {
	key   connKey
	nc    net.Conn
	state connState
	cond  *sync.Cond // on Device.mu

	closed bool
	// guest → host
	rxbuf  bytes.Buffer
	rxCnt  uint32 // bytes received from the guest
	fwdCnt uint32 // bytes written to the host socket
	advFwd uint32 // fwdCnt last told to the guest
	// host → guest
	txbuf        bytes.Buffer
	txCnt        uint32 // bytes sent to the guest
	peerBufAlloc uint32
	peerFwdCnt   uint32
	peerShut     uint32
	hostEOF      bool
	sentShut     bool

	needCredit bool
	queued     bool
	greeting   string
}

// Device is a virtio-vsock device.
type Device struct {
	mu       sync.Mutex
	cid      uint64
	uds      string
	ln       *net.UnixListener
	env      *virtio.Env
	conns    map[connKey]*conn
	ctrl     []Header
	ready    []*conn
	nextPort uint32
	event    bool // transport reset event pending
	closed   bool
	paused   bool                  // snapshot in progress: no guest memory access
	hs       map[net.Conn]struct{} // connections still in the CONNECT handshake
	wg       sync.WaitGroup
}

// New creates the device and starts listening on opts.UDSPath (a stale socket
// file there is replaced; a live one is an error).
func New(opts Options) (*Device, error) {
	if opts.GuestCID < 3 || opts.GuestCID > 0xFFFFFFFF {
		return nil, fmt.Errorf("virtio-vsock: guest cid %d out of range [3, 2^32)", opts.GuestCID)
	}
	if opts.UDSPath == "" {
		return nil, errors.New("virtio-vsock: no unix socket path")
	}
	// A socket file left by a dead VMM is replaced; one somebody still
	// listens on is not stolen.
	if fi, err := os.Lstat(opts.UDSPath); err == nil && fi.Mode()&os.ModeSocket != 0 {
		if c, err := net.DialTimeout("unix", opts.UDSPath, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("virtio-vsock: %s is in use by a live listener", opts.UDSPath)
		}
		_ = os.Remove(opts.UDSPath)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: opts.UDSPath, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("virtio-vsock: listen: %w", err)
	}
	d := &Device{cid: opts.GuestCID, uds: opts.UDSPath, ln: ln, conns: map[connKey]*conn{},
		nextPort: firstHostPort, hs: map[net.Conn]struct{}{}}
	d.wg.Add(1)
	go d.acceptLoop()
	return d, nil
}

// Close stops the listener and every connection and waits for the device's goroutines.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	err := d.ln.Close()
	d.dropAllLocked()
	for c := range d.hs {
		c.Close()
	}
	d.env = nil
	d.mu.Unlock()
	d.wg.Wait()
	return err
}

func (d *Device) DeviceID() uint16     { return virtio.IDVsock }
func (d *Device) Features() uint64     { return 0 }
func (d *Device) QueueSizes() []uint16 { return []uint16{QueueSize, QueueSize, QueueSize} }

// GuestCID returns the configured guest CID.
func (d *Device) GuestCID() uint64 { return d.cid }

// ReadConfig serves struct virtio_vsock_config { le64 guest_cid; }.
func (d *Device) ReadConfig(off uint64, p []byte) {
	var cfg [8]byte
	binary.LittleEndian.PutUint64(cfg[:], d.cid)
	clear(p)
	if off < 8 {
		copy(p, cfg[off:])
	}
}

// WriteConfig ignores writes: guest_cid is read-only.
func (d *Device) WriteConfig(uint64, []byte) {}

// Activate implements virtio.Device.
func (d *Device) Activate(env *virtio.Env) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errors.New("virtio-vsock: device closed")
	}
	d.env = env
	return nil
}

// Reset implements virtio.Device: every connection is dropped.
func (d *Device) Reset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dropAllLocked()
	d.env = nil
}

// TransportReset drops all connections and queues a transport-reset event for
// the guest (sent after a snapshot restore: the guest's connections refer to
// host sockets that no longer exist). Listeners on both sides survive.
func (d *Device) TransportReset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dropAllLocked()
	d.event = true
	d.deliverEventLocked()
}

func (d *Device) dropAllLocked() {
	for _, c := range d.conns {
		d.closeLocked(c, false)
	}
	d.ctrl = nil
	d.ready = nil
}

// Pause implements virtio.Quiescer: the host-side goroutines keep buffering
// (within the guest's credit) but nothing touches guest memory until Resume.
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
	if d.env != nil {
		// Ordering: a pending transport reset (restore, rollback) goes to
		// the guest before any packet. A host connect accepted after
		// TransportReset but before this Resume is queued as an OP_REQUEST;
		// sent first, the guest could accept it and then reset it with
		// every other connection when it handles the event, so the new
		// connection would die and the agent count a second reset.
		d.deliverEventLocked()
		d.processTxLocked()
		d.processRxLocked()
	}
}

// Notify implements virtio.Device.
func (d *Device) Notify(q int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.env == nil || d.paused {
		return
	}
	switch q {
	case TxQueue:
		d.processTxLocked()
		d.processRxLocked() // answers to what the guest just sent
	case RxQueue:
		d.processRxLocked()
	case EventQueue:
		d.deliverEventLocked()
	}
}

// ---- guest → device (tx queue) ----

func (d *Device) processTxLocked() {
	if d.env == nil || d.paused {
		return
	}
	q := d.env.Queues[TxQueue]
	done := false
	var hb [HeaderLen]byte
	for {
		c, err := q.Pop()
		if err != nil {
			d.env.NeedsReset(fmt.Errorf("virtio-vsock tx: %w", err))
			return
		}
		if c == nil {
			break
		}
		r := c.Reader()
		if _, err := io.ReadFull(r, hb[:]); err == nil {
			h, _ := ParseHeader(hb[:])
			if uint64(h.Len) <= r.Remaining() && h.Len <= MaxPayload {
				d.handlePacketLocked(h, r)
			} else {
				log.WithField("len", h.Len).Debug("vsock: dropping packet with bad length")
			}
		}
		if err := q.PushUsed(c.Head, 0); err != nil {
			d.env.NeedsReset(fmt.Errorf("virtio-vsock tx: %w", err))
			return
		}
		done = true
	}
	if done {
		d.env.Used(TxQueue)
	}
}

func (d *Device) handlePacketLocked(h Header, payload *virtio.ChainReader) {
	if h.SrcCID != d.cid || h.DstCID != HostCID {
		return // not from our guest or not for the host: drop, as Firecracker does
	}
	key := connKey{local: h.DstPort, peer: h.SrcPort}
	c := d.conns[key]
	if h.Type != TypeStream {
		if h.Op != OpRst {
			d.rstLocked(h)
		}
		return
	}
	if c != nil {
		c.peerBufAlloc, c.peerFwdCnt = h.BufAlloc, h.FwdCnt
		c.cond.Broadcast()
	}
	switch h.Op {
	case OpRequest:
		if c != nil {
			d.closeLocked(c, true)
			return
		}
		if len(d.conns) >= MaxConns {
			d.rstLocked(h)
			return
		}
		d.guestConnectLocked(h, key)
	case OpResponse:
		if c == nil || c.state != stAwaiting {
			d.rstLocked(h)
			if c != nil {
				d.closeLocked(c, false)
			}
			return
		}
		c.state = stEstablished
		c.greeting = "OK " + strconv.FormatUint(uint64(key.local), 10) + "\n"
		d.startIOLocked(c)
	case OpRW:
		if c == nil || c.state != stEstablished {
			d.rstLocked(h)
			return
		}
		if c.peerShut&ShutdownSend != 0 {
			return
		}
		// The guest may only have BufAlloc bytes beyond the fwd_cnt we last told it.
		if uint64(c.rxCnt-c.advFwd)+uint64(h.Len) > BufAlloc {
			// The guest ignored our credit: it cannot be trusted with this stream.
			d.closeLocked(c, true)
			return
		}
		if _, err := io.CopyN(&c.rxbuf, payload, int64(h.Len)); err != nil {
			d.closeLocked(c, true)
			return
		}
		c.rxCnt += h.Len
		c.cond.Broadcast()
	case OpCreditUpdate:
		// Credit fields already applied above.
		if c == nil {
			d.rstLocked(h)
		}
	case OpCreditRequest:
		if c == nil {
			d.rstLocked(h)
			return
		}
		c.needCredit = true
		d.queueConnLocked(c)
	case OpShutdown:
		if c == nil {
			d.rstLocked(h)
			return
		}
		c.peerShut |= h.Flags & (ShutdownRcv | ShutdownSend)
		c.cond.Broadcast()
		if c.state != stEstablished {
			d.closeLocked(c, true)
		}
		// An established connection is finished by its writer once it has
		// forwarded what the guest sent (then RST, which Linux waits for).
	case OpRst:
		if c != nil {
			d.closeLocked(c, false)
		}
	default:
		if c != nil {
			d.closeLocked(c, true)
		} else {
			d.rstLocked(h)
		}
	}
}

// guestConnectLocked dials "<uds>_<port>" for a guest REQUEST.
func (d *Device) guestConnectLocked(h Header, key connKey) {
	c := &conn{key: key, state: stConnecting, cond: sync.NewCond(&d.mu),
		peerBufAlloc: h.BufAlloc, peerFwdCnt: h.FwdCnt}
	d.conns[key] = c
	path := d.uds + "_" + strconv.FormatUint(uint64(key.local), 10)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		nc, err := net.DialTimeout("unix", path, ConnectTimeout)
		d.mu.Lock()
		defer d.mu.Unlock()
		if c.closed || d.conns[key] != c {
			if nc != nil {
				nc.Close()
			}
			return
		}
		if err != nil {
			log.WithError(err).WithField("port", key.local).Debug("vsock: guest connect refused")
			d.closeLocked(c, true)
			d.processRxLocked()
			return
		}
		c.nc = nc
		c.state = stEstablished
		d.ctrlLocked(c, OpResponse, 0)
		d.startIOLocked(c)
		d.processRxLocked()
	}()
}

// closeLocked tears a connection down; rst tells the guest.
func (d *Device) closeLocked(c *conn, rst bool) {
	if c.closed {
		return
	}
	c.closed = true
	if d.conns[c.key] == c {
		delete(d.conns, c.key)
	}
	if c.nc != nil {
		c.nc.Close()
	}
	c.cond.Broadcast()
	if rst {
		d.ctrlLocked(nil, OpRst, 0, c.key)
	}
}

// rstLocked answers a packet with RST (no connection state needed).
func (d *Device) rstLocked(h Header) {
	d.ctrlLocked(nil, OpRst, 0, connKey{local: h.DstPort, peer: h.SrcPort})
}

// ctrlLocked queues a header-only packet. For a live connection c its key and
// credit fields are used; otherwise key[0].
func (d *Device) ctrlLocked(c *conn, op uint16, flags uint32, key ...connKey) {
	if len(d.ctrl) >= maxCtrl {
		log.Debug("vsock: control queue full, dropping packet")
		return
	}
	h := Header{SrcCID: HostCID, DstCID: d.cid, Type: TypeStream, Op: op, Flags: flags, BufAlloc: BufAlloc}
	if c != nil {
		h.SrcPort, h.DstPort, h.FwdCnt = c.key.local, c.key.peer, c.fwdCnt
		c.advFwd = c.fwdCnt
	} else if len(key) > 0 {
		h.SrcPort, h.DstPort = key[0].local, key[0].peer
	}
	d.ctrl = append(d.ctrl, h)
}

func (d *Device) queueConnLocked(c *conn) {
	if !c.queued && !c.closed {
		c.queued = true
		d.ready = append(d.ready, c)
	}
}

func (c *conn) hasWork() bool {
	return !c.closed && c.state == stEstablished &&
		(c.txbuf.Len() > 0 || c.needCredit || (c.hostEOF && !c.sentShut))
}

func (d *Device) hasRxWorkLocked() bool {
	if len(d.ctrl) > 0 {
		return true
	}
	for len(d.ready) > 0 {
		if d.ready[0].hasWork() {
			return true
		}
		d.ready[0].queued = false
		d.ready = d.ready[1:]
	}
	return false
}

// nextPacketLocked produces the next packet for the guest with at most space
// payload bytes. hasRxWorkLocked must have returned true.
func (d *Device) nextPacketLocked(space uint64) (Header, []byte) {
	if len(d.ctrl) > 0 {
		h := d.ctrl[0]
		d.ctrl = d.ctrl[1:]
		return h, nil
	}
	c := d.ready[0]
	d.ready = d.ready[1:]
	c.queued = false
	h := Header{SrcCID: HostCID, DstCID: d.cid, SrcPort: c.key.local, DstPort: c.key.peer,
		Type: TypeStream, BufAlloc: BufAlloc, FwdCnt: c.fwdCnt}
	c.advFwd = c.fwdCnt
	var payload []byte
	switch {
	case c.txbuf.Len() > 0 && space > 0:
		n := min(uint64(c.txbuf.Len()), space, MaxPayload)
		payload = c.txbuf.Next(int(n))
		c.txCnt += uint32(n)
		h.Op, h.Len = OpRW, uint32(n)
		c.needCredit = false // every packet carries our credit
	case c.hostEOF && c.txbuf.Len() == 0 && !c.sentShut:
		h.Op, h.Flags = OpShutdown, ShutdownSend
		c.sentShut = true
		c.needCredit = false
	default:
		h.Op = OpCreditUpdate
		c.needCredit = false
	}
	if c.hasWork() {
		d.queueConnLocked(c)
	}
	return h, payload
}

// processRxLocked fills the guest's rx buffers with pending packets.
func (d *Device) processRxLocked() {
	if d.env == nil || d.paused {
		return
	}
	q := d.env.Queues[RxQueue]
	sent := false
	var hb [HeaderLen]byte
	for d.hasRxWorkLocked() {
		ch, err := q.Pop()
		if err != nil {
			d.env.NeedsReset(fmt.Errorf("virtio-vsock rx: %w", err))
			return
		}
		if ch == nil {
			break // the guest will kick the rx queue when it adds buffers
		}
		w := ch.Writer()
		if w.Remaining() < HeaderLen {
			_ = q.PushUsed(ch.Head, 0)
			sent = true
			continue
		}
		h, payload := d.nextPacketLocked(w.Remaining() - HeaderLen)
		h.Encode(hb[:])
		if _, err := w.Write(hb[:]); err == nil && len(payload) > 0 {
			_, _ = w.Write(payload) // a buffer outside RAM loses the data: the guest's fault
		}
		if err := q.PushUsed(ch.Head, uint32(w.Written())); err != nil {
			d.env.NeedsReset(fmt.Errorf("virtio-vsock rx: %w", err))
			return
		}
		sent = true
	}
	if sent {
		d.env.Used(RxQueue)
	}
}

func (d *Device) deliverEventLocked() {
	if !d.event || d.env == nil || d.paused {
		return
	}
	q := d.env.Queues[EventQueue]
	ch, err := q.Pop()
	if err != nil {
		d.env.NeedsReset(fmt.Errorf("virtio-vsock event: %w", err))
		return
	}
	if ch == nil {
		return // delivered when the guest posts an event buffer
	}
	var ev [4]byte
	binary.LittleEndian.PutUint32(ev[:], eventTransportReset)
	w := ch.Writer()
	_, _ = w.Write(ev[:])
	if err := q.PushUsed(ch.Head, uint32(w.Written())); err != nil {
		d.env.NeedsReset(fmt.Errorf("virtio-vsock event: %w", err))
		return
	}
	d.event = false
	d.env.Used(EventQueue)
}
