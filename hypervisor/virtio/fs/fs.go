// Package fs is virtio-fs (virtio device 26): a FUSE server inside the VMM
// that passes one host directory through to the guest (mount -t virtiofs
// TAG DIR). There is no virtiofsd: requests are served synchronously in
// Notify, from an O_PATH fd per inode, confined beneath the shared
// directory (see inode.go). Everything read from the queues is untrusted.
package fs

import (
	"encoding/binary"
	"fmt"
	"io"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/hypervisor/virtio"
)

var logger = logrus.WithField("component", "virtio-fs")

// ID is the virtio device ID of a filesystem device.
const ID = 26

// Queues: hiprio (FORGET, BATCH_FORGET, INTERRUPT) and one request queue.
const (
	QueueSize     = 128
	numReqQueues  = 1
	hiprioQueue   = 0
	TagLen        = 36
	configLen     = TagLen + 4
	maxRequestLen = inHeaderLen + 64 + MaxWrite + 2*(maxPath+1)
)

// Options configure a share.
type Options struct {
	// Tag is what the guest mounts (mount -t virtiofs TAG DIR); 1–36 bytes.
	Tag string
	// Dir is the host directory shared.
	Dir string
	// ReadOnly refuses every change with EROFS.
	ReadOnly bool
}

// Device is a virtio-fs device.
type Device struct {
	opts Options
	srv  *Server

	mu  sync.Mutex
	env *virtio.Env
	buf []byte
	// restored: a state was just restored and the transport has not
	// activated the device since (see Reset).
	restored bool
}

// Open opens the share.
func Open(opts Options) (*Device, error) {
	if opts.Tag == "" || len(opts.Tag) > TagLen {
		return nil, fmt.Errorf("virtio-fs: tag %q must be 1 to %d bytes", opts.Tag, TagLen)
	}
	srv, err := NewServer(opts.Dir, opts.ReadOnly)
	if err != nil {
		return nil, err
	}
	return &Device{opts: opts, srv: srv, buf: make([]byte, maxRequestLen)}, nil
}

// Close releases the share's host fds. Call after the transport is reset
// or the VM stopped.
func (d *Device) Close() error { return d.srv.Close() }

// Server is the device's FUSE server.
func (d *Device) Server() *Server { return d.srv }

func (d *Device) DeviceID() uint16 { return ID }
func (d *Device) Features() uint64 { return 0 }
func (d *Device) QueueSizes() []uint16 {
	return []uint16{QueueSize, QueueSize}
}

// ReadConfig serves struct virtio_fs_config: tag[36], num_request_queues.
func (d *Device) ReadConfig(off uint64, p []byte) {
	var cfg [configLen]byte
	copy(cfg[:TagLen], d.opts.Tag)
	binary.LittleEndian.PutUint32(cfg[TagLen:], numReqQueues)
	clear(p)
	if off < uint64(len(cfg)) {
		copy(p, cfg[off:])
	}
}

// WriteConfig ignores writes: the config is read-only.
func (d *Device) WriteConfig(uint64, []byte) {}

// Activate implements virtio.Device.
func (d *Device) Activate(env *virtio.Env) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.env = env
	d.restored = false
	return nil
}

// Reset implements virtio.Device: the guest's FUSE session ends with it,
// except for the reset a transport restore makes between a restored state
// and re-activating it. Ordering: the machine restores each device's state,
// then its transport's, which resets a device it finds active (an in-place
// rollback) before activating it again (virtio/state.go): that reset must
// not drop the session Restore just re-opened.
func (d *Device) Reset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.env = nil
	if d.restored {
		return
	}
	d.srv.Reset()
}

// Notify serves every available request of queue q.
func (d *Device) Notify(q int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.env == nil || q < 0 || q >= len(d.env.Queues) {
		return
	}
	queue := d.env.Queues[q]
	done := false
	for {
		c, err := queue.Pop()
		if err != nil {
			d.env.NeedsReset(fmt.Errorf("virtio-fs: %w", err))
			return
		}
		if c == nil {
			break
		}
		written := d.serve(c, q == hiprioQueue)
		if err := queue.PushUsed(c.Head, written); err != nil {
			d.env.NeedsReset(fmt.Errorf("virtio-fs: %w", err))
			return
		}
		done = true
	}
	if done {
		d.env.Used(q)
	}
}

// serve runs one chain and returns the used length.
func (d *Device) serve(c *virtio.Chain, hiprio bool) uint32 {
	n := c.ReadableLen()
	if n > uint64(len(d.buf)) {
		logger.WithField("len", n).Debug("virtio-fs: request longer than the largest FUSE request refused")
		return d.refuse(c)
	}
	req := d.buf[:n]
	if _, err := io.ReadFull(c.Reader(), req); err != nil {
		return 0 // readable buffers outside guest RAM
	}
	if hiprio {
		// Only requests without replies belong here; a guest that puts
		// others there gets nothing (the kernel never does).
		if r, err := ParseRequest(req); err != nil || (r.Opcode != opForget && r.Opcode != opBatchForget && r.Opcode != opInterrupt) {
			return 0
		}
	}
	w := c.Writer()
	reply := d.srv.Handle(req, int(min(w.Remaining(), 1<<30)))
	if len(reply) == 0 {
		return 0
	}
	if uint64(len(reply)) > w.Remaining() {
		logger.WithField("need", len(reply)).Debug("virtio-fs: reply larger than the guest's buffers, truncated")
		reply = reply[:w.Remaining()]
	}
	k, _ := w.Write(reply)
	return uint32(k)
}

// refuse answers an oversized request with EINVAL when its header is readable.
func (d *Device) refuse(c *virtio.Chain) uint32 {
	var h [inHeaderLen]byte
	if _, err := io.ReadFull(c.Reader(), h[:]); err != nil {
		return 0
	}
	unique := binary.LittleEndian.Uint64(h[8:])
	k, _ := c.Writer().Write(outHeader(unique, -22, 0))
	return uint32(k)
}
