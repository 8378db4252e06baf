package virtio

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
)

// Descriptor flags.
const (
	descFNext     = 1
	descFWrite    = 2
	descFIndirect = 4

	availFNoInterrupt = 1
	usedFNoNotify     = 1

	descSize = 16
	// MaxIndirect bounds an indirect table (entries). Linux never builds one
	// larger than the queue size or the device's seg_max; this only stops a
	// hostile table from costing us memory.
	MaxIndirect = 1024
	// MaxQueueSize is the largest split queue size the spec allows.
	MaxQueueSize = 32768
)

// ErrRing reports a corrupt ring (bad avail index or head): the transport puts
// the device into DEVICE_NEEDS_RESET, the spec's answer to a broken driver.
var ErrRing = errors.New("virtqueue ring corrupt")

// Buffer is one guest buffer of a descriptor chain.
type Buffer struct {
	Addr uint64
	Len  uint32
}

// Chain is a parsed descriptor chain: device-readable buffers then
// device-writable ones (the spec orders them so; a chain that interleaves is rejected).
type Chain struct {
	Head     uint16
	Readable []Buffer
	Writable []Buffer
	mem      guestMem
}

// ReadableLen is the total length of the readable part.
func (c *Chain) ReadableLen() uint64 { return sumLen(c.Readable) }

// WritableLen is the total length of the writable part.
func (c *Chain) WritableLen() uint64 { return sumLen(c.Writable) }

func sumLen(bs []Buffer) uint64 {
	var n uint64
	for _, b := range bs {
		n += uint64(b.Len)
	}
	return n
}

// Reader returns a reader over the readable buffers.
func (c *Chain) Reader() *ChainReader { return &ChainReader{mem: c.mem, bufs: c.Readable} }

// Writer returns a writer over the writable buffers.
func (c *Chain) Writer() *ChainWriter { return &ChainWriter{mem: c.mem, bufs: c.Writable} }

// SplitWritable splits the writable part into a body writer and a writer for
// its last n bytes (e.g. virtio-blk's status byte), so the tail can be written
// even when the body is not. ok is false if the writable part is shorter than n.
func (c *Chain) SplitWritable(n uint64) (body, tail *ChainWriter, ok bool) {
	total := c.WritableLen()
	if total < n {
		return nil, nil, false
	}
	keep := total - n
	var b, t []Buffer
	for _, buf := range c.Writable {
		l := uint64(buf.Len)
		switch {
		case keep >= l:
			b = append(b, buf)
			keep -= l
		case keep > 0:
			b = append(b, Buffer{Addr: buf.Addr, Len: uint32(keep)})
			t = append(t, Buffer{Addr: buf.Addr + keep, Len: uint32(l - keep)})
			keep = 0
		default:
			t = append(t, buf)
		}
	}
	return &ChainWriter{mem: c.mem, bufs: b}, &ChainWriter{mem: c.mem, bufs: t}, true
}

// ChainReader reads the readable part of a chain in order.
type ChainReader struct {
	mem  guestMem
	bufs []Buffer
	off  uint32
}

func (r *ChainReader) Read(p []byte) (int, error) {
	n := 0
	for len(p) > 0 && len(r.bufs) > 0 {
		b := r.bufs[0]
		if r.off >= b.Len {
			r.bufs, r.off = r.bufs[1:], 0
			continue
		}
		k := min(uint64(len(p)), uint64(b.Len-r.off))
		if err := r.mem.read(p[:k], b.Addr+uint64(r.off)); err != nil {
			return n, err
		}
		n += int(k)
		p = p[k:]
		r.off += uint32(k)
	}
	if n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	return n, nil
}

// Remaining is the number of unread readable bytes.
func (r *ChainReader) Remaining() uint64 { return sumLen(r.bufs) - uint64(r.off) }

// ChainWriter writes the writable part of a chain in order.
type ChainWriter struct {
	mem     guestMem
	bufs    []Buffer
	off     uint32
	written uint64
}

// ErrChainFull is returned when a write exceeds the writable part of a chain.
var ErrChainFull = errors.New("descriptor chain has no more writable space")

func (w *ChainWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		if len(w.bufs) == 0 {
			return n, ErrChainFull
		}
		b := w.bufs[0]
		if w.off >= b.Len {
			w.bufs, w.off = w.bufs[1:], 0
			continue
		}
		k := min(uint64(len(p)), uint64(b.Len-w.off))
		if err := w.mem.write(p[:k], b.Addr+uint64(w.off)); err != nil {
			return n, err
		}
		n += int(k)
		p = p[k:]
		w.off += uint32(k)
		w.written += k
	}
	return n, nil
}

// Written is the number of bytes written so far (the used length).
func (w *ChainWriter) Written() uint64 { return w.written }

// Remaining is the writable space left.
func (w *ChainWriter) Remaining() uint64 { return sumLen(w.bufs) - uint64(w.off) }

// QueueState is the serializable state of one split virtqueue.
// Its json names are the snapshot format's: changing one is a snapshot.Version bump.
type QueueState struct {
	Size      uint16 `json:"Size"`
	Ready     bool   `json:"Ready"`
	Desc      uint64 `json:"Desc"`
	Avail     uint64 `json:"Avail"`
	Used      uint64 `json:"Used"`
	Vector    uint16 `json:"Vector"`
	LastAvail uint16 `json:"LastAvail"`
	UsedIdx   uint16 `json:"UsedIdx"`
	Signalled uint16 `json:"Signalled"`
}

// Queue is one split virtqueue. It is not safe for concurrent use; the device
// owning it serializes access (its own lock).
type Queue struct {
	MaxSize uint16
	QueueState
	eventIdx bool
	mem      guestMem
}

// NewQueue returns a queue with maximum (and initial) size max.
func NewQueue(max uint16) *Queue {
	q := &Queue{MaxSize: max}
	q.reset()
	return q
}

func (q *Queue) reset() {
	q.QueueState = QueueState{Size: q.MaxSize, Vector: NoVector}
}

// Validate checks the ring addresses the driver programmed.
func (q *Queue) Validate() error {
	s := uint64(q.Size)
	if s == 0 || s > uint64(q.MaxSize) || s&(s-1) != 0 {
		return fmt.Errorf("queue size %d invalid (max %d, power of two)", s, q.MaxSize)
	}
	if q.Desc%16 != 0 || q.Avail%2 != 0 || q.Used%4 != 0 {
		return fmt.Errorf("queue rings misaligned: desc %#x avail %#x used %#x", q.Desc, q.Avail, q.Used)
	}
	for _, r := range [][2]uint64{{q.Desc, 16 * s}, {q.Avail, 6 + 2*s}, {q.Used, 6 + 8*s}} {
		if r[0]+r[1] < r[0] {
			return fmt.Errorf("queue ring at %#x+%#x wraps", r[0], r[1])
		}
	}
	return nil
}

// fence orders our stores to guest memory before the following loads (x86 may
// reorder a store with a later load; a locked instruction is a full barrier).
// Drivers do the same between publishing an index and reading the event field.
var fenceWord atomic.Uint64

func fence() { fenceWord.Add(1) }

// Pop returns the next available chain, or nil when the queue is empty. A
// malformed chain (loop, bad index, bad indirect table, readable after
// writable, unreadable descriptor memory) is completed with used length 0 and
// skipped; a corrupt ring returns an error wrapping ErrRing.
func (q *Queue) Pop() (*Chain, error) {
	if !q.Ready {
		return nil, nil
	}
	for tries := 0; tries <= int(q.Size); tries++ {
		availIdx, err := q.mem.u16(q.Avail + 2)
		if err != nil {
			return nil, fmt.Errorf("%w: read avail idx: %v", ErrRing, err)
		}
		if availIdx == q.LastAvail {
			if !q.eventIdx {
				return nil, nil
			}
			// Tell the driver which index to kick at, then re-check so an
			// entry added between our read and this write is not missed.
			if err := q.mem.putU16(q.Used+4+8*uint64(q.Size), q.LastAvail); err != nil {
				return nil, fmt.Errorf("%w: write avail_event: %v", ErrRing, err)
			}
			fence()
			if availIdx, err = q.mem.u16(q.Avail + 2); err != nil {
				return nil, fmt.Errorf("%w: read avail idx: %v", ErrRing, err)
			}
			if availIdx == q.LastAvail {
				return nil, nil
			}
		}
		if pending := availIdx - q.LastAvail; pending > q.Size {
			return nil, fmt.Errorf("%w: avail idx %d is %d ahead of %d (size %d)", ErrRing, availIdx, pending, q.LastAvail, q.Size)
		}
		head, err := q.mem.u16(q.Avail + 4 + 2*uint64(q.LastAvail%q.Size))
		if err != nil {
			return nil, fmt.Errorf("%w: read avail ring: %v", ErrRing, err)
		}
		if head >= q.Size {
			return nil, fmt.Errorf("%w: head %d >= size %d", ErrRing, head, q.Size)
		}
		q.LastAvail++
		c, err := q.walk(head)
		if err == nil {
			return c, nil
		}
		// Debug, not Warn: a hostile guest must not be able to flood the host log.
		logger.WithError(err).WithField("head", head).Debug("virtio: dropping malformed descriptor chain")
		if err := q.PushUsed(head, 0); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

// walk follows a chain from head. Every step is counted, so loops end.
func (q *Queue) walk(head uint16) (*Chain, error) {
	c := &Chain{Head: head, mem: q.mem}
	var raw [descSize]byte
	table, tableLen := q.Desc, uint64(q.Size)
	idx := uint64(head)
	indirect := false
	budget := uint64(q.Size)
	for steps := uint64(0); ; steps++ {
		if steps >= budget {
			return nil, fmt.Errorf("descriptor chain longer than %d (loop?)", budget)
		}
		if idx >= tableLen {
			return nil, fmt.Errorf("descriptor index %d out of table of %d", idx, tableLen)
		}
		if err := q.mem.read(raw[:], table+idx*descSize); err != nil {
			return nil, fmt.Errorf("read descriptor %d: %w", idx, err)
		}
		addr := binary.LittleEndian.Uint64(raw[0:])
		length := binary.LittleEndian.Uint32(raw[8:])
		flags := binary.LittleEndian.Uint16(raw[12:])
		next := binary.LittleEndian.Uint16(raw[14:])
		if flags&descFIndirect != 0 {
			if indirect {
				return nil, errors.New("nested indirect descriptor")
			}
			if flags&descFNext != 0 {
				return nil, errors.New("indirect descriptor with NEXT flag")
			}
			if length == 0 || length%descSize != 0 || length/descSize > MaxIndirect {
				return nil, fmt.Errorf("indirect table length %d invalid", length)
			}
			if addr%descSize != 0 || addr+uint64(length) < addr {
				return nil, fmt.Errorf("indirect table address %#x invalid", addr)
			}
			indirect = true
			table, tableLen, idx = addr, uint64(length/descSize), 0
			budget = steps + 1 + tableLen
			continue
		}
		if addr+uint64(length) < addr {
			return nil, fmt.Errorf("buffer %#x+%#x wraps", addr, length)
		}
		b := Buffer{Addr: addr, Len: length}
		if flags&descFWrite != 0 {
			c.Writable = append(c.Writable, b)
		} else {
			if len(c.Writable) > 0 {
				return nil, errors.New("device-readable descriptor after a writable one")
			}
			c.Readable = append(c.Readable, b)
		}
		if flags&descFNext == 0 {
			return c, nil
		}
		idx = uint64(next)
	}
}

// PushUsed returns a chain to the driver with written bytes.
func (q *Queue) PushUsed(head uint16, written uint32) error {
	var e [8]byte
	binary.LittleEndian.PutUint32(e[0:], uint32(head))
	binary.LittleEndian.PutUint32(e[4:], written)
	slot := q.Used + 4 + 8*uint64(q.UsedIdx%q.Size)
	if err := q.mem.write(e[:], slot); err != nil {
		return fmt.Errorf("%w: write used elem: %v", ErrRing, err)
	}
	// Ordering: the element must be visible before the index that publishes it
	// (x86 keeps stores in order; Memory.WriteAt is a plain copy).
	q.UsedIdx++
	if err := q.mem.putU16(q.Used+2, q.UsedIdx); err != nil {
		return fmt.Errorf("%w: write used idx: %v", ErrRing, err)
	}
	return nil
}

// NeedsInterrupt reports whether the driver wants an interrupt for the used
// entries published since the last call (VIRTQ_AVAIL_F_NO_INTERRUPT, or
// used_event with VIRTIO_F_EVENT_IDX).
func (q *Queue) NeedsInterrupt() bool {
	fence() // used idx store before used_event/flags load
	old := q.Signalled
	q.Signalled = q.UsedIdx
	if q.eventIdx {
		ev, err := q.mem.u16(q.Avail + 4 + 2*uint64(q.Size))
		if err != nil {
			return true
		}
		return q.UsedIdx-ev-1 < q.UsedIdx-old
	}
	flags, err := q.mem.u16(q.Avail)
	if err != nil {
		return true
	}
	return flags&availFNoInterrupt == 0
}
