// Package blk is virtio-blk backed by a regular file (or block device):
// read, write, flush and get-id, with an optional read-only mode.
package blk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"github.com/cube-runtime/cube/hypervisor/virtio"
)

// Feature bits.
const (
	FSegMax  = 1 << 2
	FRO      = 1 << 5
	FBlkSize = 1 << 6
	FFlush   = 1 << 9
)

// Request types and status values.
const (
	TypeIn    = 0
	TypeOut   = 1
	TypeFlush = 4
	TypeGetID = 8

	StatusOK     = 0
	StatusIOErr  = 1
	StatusUnsupp = 2

	SectorSize = 512
	// IDLen is the length of the GET_ID answer (VIRTIO_BLK_ID_BYTES).
	IDLen = 20
	// QueueSize is the request queue's maximum size.
	QueueSize = 256
	// SegMax is advertised in config: data segments per request.
	SegMax = QueueSize - 2

	headerLen = 16
	chunk     = 64 << 10
)

// Options configure a disk.
type Options struct {
	Path     string
	ReadOnly bool
	// Serial is returned by GET_ID (/sys/block/vdX/serial); at most 20 bytes.
	Serial string
}

// Device is a virtio-blk device.
type Device struct {
	// mu serializes request processing with backing-file changes: a
	// request runs entirely on one file.
	mu   sync.Mutex
	opts Options // Path changes with SetBacking (under mu); the rest is fixed
	// openedPath is the file the device was opened with; SetBacking away
	// from it is a media change that rollback must not paper over.
	openedPath string
	file       *os.File
	// sectors is atomic: config-space reads come from vCPU threads and
	// must not wait for a long request holding mu.
	sectors atomic.Uint64
	env     *virtio.Env
	// mediaRO: the current backing was set read-only (SetBackingMode);
	// writes fail with IOERR. Under mu.
	mediaRO bool
	buf     []byte
}

// Open opens the backing file.
func Open(opts Options) (*Device, error) {
	if len(opts.Serial) > IDLen {
		return nil, fmt.Errorf("virtio-blk %s: serial %q longer than %d bytes", opts.Path, opts.Serial, IDLen)
	}
	f, sectors, err := openBacking(opts.Path, opts.ReadOnly)
	if err != nil {
		return nil, err
	}
	d := &Device{opts: opts, openedPath: opts.Path, file: f, buf: make([]byte, chunk)}
	d.sectors.Store(sectors)
	return d, nil
}

// openBacking opens a regular file or block device read-write (or
// read-only) and returns it with its capacity in whole sectors.
func openBacking(path string, readOnly bool) (*os.File, uint64, error) {
	flag := os.O_RDWR
	if readOnly {
		flag = os.O_RDONLY
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("virtio-blk: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("virtio-blk %s: %w", path, err)
	}
	if m := fi.Mode(); !m.IsRegular() && m&os.ModeDevice == 0 {
		f.Close()
		return nil, 0, fmt.Errorf("virtio-blk %s: not a regular file or block device (%v)", path, m.Type())
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("virtio-blk %s: size: %w", path, err)
	}
	// A tail shorter than a sector is not addressable by the guest.
	return f, uint64(size) / SectorSize, nil
}

// Close closes the backing file. Call after the transport is reset or the VM stopped.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.file.Close()
}

// Sectors is the capacity in 512-byte sectors.
func (d *Device) Sectors() uint64 { return d.sectors.Load() }

func (d *Device) DeviceID() uint16     { return virtio.IDBlock }
func (d *Device) QueueSizes() []uint16 { return []uint16{QueueSize} }

// Features implements virtio.Device.
func (d *Device) Features() uint64 {
	f := uint64(FSegMax | FBlkSize | FFlush)
	if d.opts.ReadOnly {
		f |= FRO
	}
	return f
}

// ReadConfig serves struct virtio_blk_config (capacity, seg_max, blk_size).
func (d *Device) ReadConfig(off uint64, p []byte) {
	var cfg [0x40]byte
	binary.LittleEndian.PutUint64(cfg[0x00:], d.sectors.Load())
	binary.LittleEndian.PutUint32(cfg[0x0C:], SegMax)
	binary.LittleEndian.PutUint32(cfg[0x14:], SectorSize)
	clear(p)
	if off < uint64(len(cfg)) {
		copy(p, cfg[off:])
	}
}

// WriteConfig ignores writes: no writable field is offered (no CONFIG_WCE).
func (d *Device) WriteConfig(uint64, []byte) {}

// Activate implements virtio.Device.
func (d *Device) Activate(env *virtio.Env) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.env = env
	return nil
}

// Reset implements virtio.Device.
func (d *Device) Reset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.env = nil
}

// Notify processes every available request synchronously.
func (d *Device) Notify(q int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.env == nil || q != 0 {
		return
	}
	queue := d.env.Queues[0]
	done := false
	for {
		c, err := queue.Pop()
		if err != nil {
			d.env.NeedsReset(fmt.Errorf("virtio-blk: %w", err))
			return
		}
		if c == nil {
			break
		}
		written := d.handle(c)
		if err := queue.PushUsed(c.Head, written); err != nil {
			d.env.NeedsReset(fmt.Errorf("virtio-blk: %w", err))
			return
		}
		done = true
	}
	if done {
		d.env.Used(0)
	}
}

// handle runs one request and returns the used length.
func (d *Device) handle(c *virtio.Chain) uint32 {
	// The status is the chain's last writable byte; it is written even when
	// the data phase fails (e.g. a data buffer outside guest RAM).
	w, st, ok := c.SplitWritable(1)
	if !ok {
		return 0 // nowhere to put a status: return the chain untouched
	}
	r := c.Reader()
	var hdr [headerLen]byte
	status := byte(StatusIOErr)
	if _, err := io.ReadFull(r, hdr[:]); err == nil {
		typ := binary.LittleEndian.Uint32(hdr[0:])
		sector := binary.LittleEndian.Uint64(hdr[8:])
		status = d.do(typ, sector, r, w, w.Remaining())
	}
	_, _ = st.Write([]byte{status}) // a status outside RAM cannot be reported
	return uint32(min(w.Written()+st.Written(), uint64(^uint32(0))))
}

func (d *Device) do(typ uint32, sector uint64, r *virtio.ChainReader, w *virtio.ChainWriter, dataLen uint64) byte {
	switch typ {
	case TypeIn:
		if err := d.checkRange(sector, dataLen); err != nil {
			return StatusIOErr
		}
		off := int64(sector * SectorSize)
		for left := dataLen; left > 0; {
			n := min(left, uint64(len(d.buf)))
			if _, err := d.file.ReadAt(d.buf[:n], off); err != nil && !errors.Is(err, io.EOF) {
				return StatusIOErr
			}
			if _, err := w.Write(d.buf[:n]); err != nil {
				return StatusIOErr
			}
			off += int64(n)
			left -= n
		}
		return StatusOK
	case TypeOut:
		if d.opts.ReadOnly || d.mediaRO {
			return StatusIOErr
		}
		n := r.Remaining()
		if err := d.checkRange(sector, n); err != nil {
			return StatusIOErr
		}
		off := int64(sector * SectorSize)
		for left := n; left > 0; {
			k := min(left, uint64(len(d.buf)))
			if _, err := io.ReadFull(r, d.buf[:k]); err != nil {
				return StatusIOErr
			}
			if _, err := d.file.WriteAt(d.buf[:k], off); err != nil {
				return StatusIOErr
			}
			off += int64(k)
			left -= k
		}
		return StatusOK
	case TypeFlush:
		if d.opts.ReadOnly || d.mediaRO {
			return StatusOK
		}
		if err := d.file.Sync(); err != nil {
			return StatusIOErr
		}
		return StatusOK
	case TypeGetID:
		var id [IDLen]byte
		copy(id[:], d.opts.Serial)
		if _, err := w.Write(id[:min(dataLen, IDLen)]); err != nil {
			return StatusIOErr
		}
		return StatusOK
	}
	return StatusUnsupp
}

// checkRange validates a transfer of n bytes at sector: whole sectors, inside the disk.
func (d *Device) checkRange(sector, n uint64) error {
	if n%SectorSize != 0 {
		return fmt.Errorf("length %d not a multiple of %d", n, SectorSize)
	}
	capacity := d.sectors.Load()
	if sector > capacity || n/SectorSize > capacity-sector {
		return fmt.Errorf("sectors %d+%d beyond capacity %d", sector, n/SectorSize, capacity)
	}
	return nil
}
