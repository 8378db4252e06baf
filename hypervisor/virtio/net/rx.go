package net

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cube-runtime/cube/hypervisor/virtio"
)

// rxLoop reads frames from the backend and delivers each to the guest,
// waiting (with the frame held) while the guest has no room or a snapshot
// is being taken. It ends when the device is closed.
func (d *Device) rxLoop() {
	defer d.wg.Done()
	buf := make([]byte, HeaderLen+MaxPacket)
	backoff := time.Duration(0)
	for {
		frame, err := d.readFrame(buf)
		if err != nil {
			d.mu.Lock()
			closed := d.closed
			d.mu.Unlock()
			if closed || errors.Is(err, os.ErrClosed) {
				return
			}
			// A tap whose interface was deleted fails every read: do not spin.
			d.stats.rxErr.Add(1)
			backoff = min(max(2*backoff, 10*time.Millisecond), time.Second)
			log.WithError(err).WithField("retry_in", backoff).Debug("virtio-net: backend read failed")
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		d.mu.Lock()
		for !d.deliverLocked(frame) {
			d.cond.Wait()
		}
		d.mu.Unlock()
	}
}

// readFrame reads one frame into buf and returns it with its header (a
// zero header is made up for a backend without one).
func (d *Device) readFrame(buf []byte) ([]byte, error) {
	if d.backend.VnetHdr() {
		n, err := d.backend.ReadFrame(buf)
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
	n, err := d.backend.ReadFrame(buf[HeaderLen:])
	if err != nil {
		return nil, err
	}
	clear(buf[:HeaderLen])
	return buf[:HeaderLen+n], nil
}

// deliverLocked gives frame (header first) to the guest. It returns false
// when the frame must wait: the device is paused or the guest has not
// posted enough buffers (a kick, Resume or Close wakes the caller). A frame
// that cannot be delivered at all is dropped and counted.
func (d *Device) deliverLocked(frame []byte) bool {
	switch {
	case d.closed:
		return true
	case d.paused:
		return false
	case d.env == nil || d.broken:
		d.stats.rxDropped.Add(1) // no driver: as a NIC that is down
		return true
	}
	env := d.env
	if len(frame) < HeaderLen {
		d.stats.rxBadHeader.Add(1)
		return true
	}
	h, _ := ParseHeader(frame)
	if _, err := CheckRx(h, len(frame)-HeaderLen, env.Features, 1); err != nil {
		d.stats.rxBadHeader.Add(1)
		log.WithError(err).Debug("virtio-net: dropping rx frame")
		return true
	}
	q := env.Queues[RxQueue]
	chains, res := d.gatherLocked(q, uint64(len(frame)), env.HasFeature(FMrgRxbuf))
	switch res {
	case gatherWait:
		return false
	case gatherRingError:
		return true
	case gatherTooLarge:
		d.stats.rxDropped.Add(1)
		return true
	case gatherBadChain:
		d.returnUnused(q, chains)
		return true
	}
	h, _ = CheckRx(h, len(frame)-HeaderLen, env.Features, uint16(len(chains)))
	h.Encode(frame)
	if !d.fillLocked(q, chains, frame) {
		return true
	}
	d.stats.rxFrames.Add(1)
	d.stats.rxBytes.Add(uint64(len(frame) - HeaderLen))
	env.Used(RxQueue)
	return true
}

type gatherResult int

const (
	gatherOK        gatherResult = iota
	gatherWait                   // not enough buffers yet: nothing consumed
	gatherTooLarge               // no buffer (non-mergeable) or not all posted buffers together fit: nothing consumed
	gatherBadChain               // a malformed chain among them: return the chains unused, drop the frame
	gatherRingError              // the ring is corrupt: the device needs a reset
)

// gatherLocked pops rx chains until they hold need bytes: one chain without
// MRG_RXBUF, as many as it takes with it. When there are not enough, the
// chains popped are given back by rewinding the queue's avail index (they
// were popped in a row, so that is exact) and the caller waits for a kick.
// A malformed chain ends the attempt: it and the chains before it go back
// to the guest unused, so a rewind never crosses a chain already returned.
func (d *Device) gatherLocked(q *virtio.Queue, need uint64, mrg bool) ([]*virtio.Chain, gatherResult) {
	start := q.LastAvail
	var chains []*virtio.Chain
	var room uint64
	for room < need {
		before := q.LastAvail
		c, err := q.Pop()
		if err != nil {
			d.needsResetLocked(err)
			return nil, gatherRingError
		}
		if skipped := q.LastAvail - before - uint16(boolInt(c != nil)); skipped > 0 {
			// Pop returned malformed chains to the guest itself: a rewind
			// may not cross them.
			d.stats.rxBadChain.Add(uint64(skipped))
			if len(chains) > 0 {
				if c != nil {
					chains = append(chains, c)
				}
				return chains, gatherBadChain
			}
			start = before + skipped
		}
		if c != nil && (len(c.Readable) > 0 || c.WritableLen() == 0) {
			d.stats.rxBadChain.Add(1)
			log.WithField("head", c.Head).Debug("virtio-net: rx chain with readable descriptors or no room")
			return append(chains, c), gatherBadChain
		}
		if c == nil {
			q.LastAvail = start
			if uint16(len(chains)) == q.Size {
				return nil, gatherTooLarge // every buffer the ring can hold would not do
			}
			return nil, gatherWait
		}
		if !mrg && c.WritableLen() < need {
			q.LastAvail = start // the guest's buffers are smaller than this frame
			return nil, gatherTooLarge
		}
		chains = append(chains, c)
		room += c.WritableLen()
	}
	return chains, gatherOK
}

// fillLocked writes frame across chains and publishes them with their
// lengths. A buffer outside guest RAM drops the frame (chains returned
// unused).
func (d *Device) fillLocked(q *virtio.Queue, chains []*virtio.Chain, frame []byte) bool {
	lens := make([]uint32, len(chains))
	rest := frame
	for i, c := range chains {
		w := c.Writer()
		n := min(uint64(len(rest)), w.Remaining())
		if _, err := w.Write(rest[:n]); err != nil {
			d.stats.rxBadChain.Add(1)
			log.WithError(err).Debug("virtio-net: rx buffer outside guest memory")
			d.returnUnused(q, chains)
			return false
		}
		lens[i] = uint32(n)
		rest = rest[n:]
	}
	for i, c := range chains {
		if err := q.PushUsed(c.Head, lens[i]); err != nil {
			d.needsResetLocked(err)
			return false
		}
	}
	return true
}

// returnUnused gives chains back to the guest with used length 0 (Linux
// counts each as an rx length error and frees the buffer).
func (d *Device) returnUnused(q *virtio.Queue, chains []*virtio.Chain) {
	for _, c := range chains {
		if err := q.PushUsed(c.Head, 0); err != nil {
			d.needsResetLocked(err)
			return
		}
	}
	d.env.Used(RxQueue)
}

// needsResetLocked reports a corrupt rx ring once; frames are dropped until
// the driver resets the device.
func (d *Device) needsResetLocked(err error) {
	d.broken = true
	d.env.NeedsReset(fmt.Errorf("virtio-net rx: %w", err))
}
