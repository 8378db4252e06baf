package virtio

import (
	"encoding/binary"
	"fmt"
)

func (t *PCITransport) readCommon(off uint64, p []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var img [0x40]byte
	le := binary.LittleEndian
	le.PutUint32(img[ccDeviceFeatureSel:], t.devFeatSel)
	if t.devFeatSel < 2 {
		le.PutUint32(img[ccDeviceFeature:], uint32(t.offered>>(32*t.devFeatSel)))
	}
	le.PutUint32(img[ccDriverFeatureSel:], t.drvFeatSel)
	if t.drvFeatSel < 2 {
		le.PutUint32(img[ccDriverFeature:], uint32(t.driverFeat>>(32*t.drvFeatSel)))
	}
	le.PutUint16(img[ccConfigMSIX:], uint16(t.configVector.Load()))
	le.PutUint16(img[ccNumQueues:], uint16(len(t.queues)))
	img[ccStatus] = t.statusLocked()
	img[ccConfigGen] = uint8(t.configGen.Load())
	le.PutUint16(img[ccQueueSelect:], t.queueSel)
	if q := t.selected(); q != nil {
		le.PutUint16(img[ccQueueSize:], q.Size)
		le.PutUint16(img[ccQueueMSIX:], q.Vector)
		if q.Ready {
			le.PutUint16(img[ccQueueEnable:], 1)
		}
		le.PutUint16(img[ccQueueNotifyOff:], t.queueSel)
		le.PutUint64(img[ccQueueDesc:], q.Desc)
		le.PutUint64(img[ccQueueDriver:], q.Avail)
		le.PutUint64(img[ccQueueDevice:], q.Used)
	}
	if off < uint64(len(img)) {
		copy(p, img[off:])
	}
}

func (t *PCITransport) selected() *Queue {
	if int(t.queueSel) < len(t.queues) {
		return t.queues[t.queueSel]
	}
	return nil
}

func (t *PCITransport) vectorOK(v uint16) uint16 {
	if int(v) < t.msix.Vectors() {
		return v
	}
	return NoVector
}

func (t *PCITransport) writeCommon(off uint64, p []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	le := binary.LittleEndian
	n := len(p)
	var v uint64
	switch n {
	case 1:
		v = uint64(p[0])
	case 2:
		v = uint64(le.Uint16(p))
	case 4:
		v = uint64(le.Uint32(p))
	case 8:
		v = le.Uint64(p)
	default:
		return
	}
	q := t.selected()
	// Queue registers are frozen once the device runs or the queue is enabled.
	qw := q != nil && !t.active && !q.Ready
	switch {
	case off == ccDeviceFeatureSel && n == 4:
		t.devFeatSel = uint32(v)
	case off == ccDriverFeatureSel && n == 4:
		t.drvFeatSel = uint32(v)
	case off == ccDriverFeature && n == 4:
		if t.status&StatusFeaturesOK != 0 || t.drvFeatSel >= 2 {
			return
		}
		shift := 32 * t.drvFeatSel
		t.driverFeat = t.driverFeat&^(0xFFFFFFFF<<shift) | (v<<shift)&t.offered
	case off == ccConfigMSIX && n == 2:
		t.configVector.Store(uint32(t.vectorOK(uint16(v))))
	case off == ccStatus && n == 1:
		t.writeStatus(uint8(v))
	case off == ccQueueSelect && n == 2:
		t.queueSel = uint16(v)
	case off == ccQueueSize && n == 2 && qw:
		s := uint16(v)
		if s != 0 && s <= q.MaxSize && s&(s-1) == 0 {
			q.Size = s
		}
	case off == ccQueueMSIX && n == 2 && q != nil && !t.active:
		q.Vector = t.vectorOK(uint16(v))
	case off == ccQueueEnable && n == 2 && qw:
		if v == 1 {
			if err := q.Validate(); err != nil {
				logger.WithError(err).WithField("queue", t.queueSel).Warn("virtio: refusing to enable queue")
				return
			}
			q.Ready = true
		}
	case qw && off >= ccQueueDesc && off < ccSize:
		base := (off - ccQueueDesc) &^ 7
		field := []*uint64{&q.Desc, &q.Avail, &q.Used}[base/8]
		switch {
		case n == 8 && off%8 == 0:
			*field = v
		case n == 4 && off%8 == 0:
			*field = *field&^0xFFFFFFFF | v
		case n == 4 && off%8 == 4:
			*field = *field&0xFFFFFFFF | v<<32
		}
	}
}

// writeStatus runs the device status state machine (transport lock held).
func (t *PCITransport) writeStatus(v uint8) {
	if v == 0 {
		t.resetLocked()
		return
	}
	old := t.status
	// Drivers only add bits; a write that clears some is treated as adding the rest.
	v |= old
	v &^= StatusNeedsReset
	if v&StatusFeaturesOK != 0 && old&StatusFeaturesOK == 0 {
		// FEATURES_OK sticks only for an acceptable subset that includes VERSION_1
		// (a legacy-only driver gets it cleared and gives up).
		if t.driverFeat&FVersion1 == 0 || t.driverFeat&^t.offered != 0 {
			v &^= StatusFeaturesOK
		}
	}
	if v&StatusDriverOK != 0 && old&StatusDriverOK == 0 {
		if v&StatusFeaturesOK == 0 {
			v &^= StatusDriverOK
		} else if err := t.activateLocked(); err != nil {
			logger.WithError(err).Warn("virtio: activating device failed")
			t.needsReset.Store(true)
		}
	}
	t.status = v
}

func (t *PCITransport) activateLocked() error {
	for i, q := range t.queues {
		q.eventIdx = t.driverFeat&FRingEventIdx != 0
		if q.Ready {
			if err := q.Validate(); err != nil {
				return fmt.Errorf("queue %d: %w", i, err)
			}
		}
	}
	t.env = &Env{
		Queues: t.queues, Features: t.driverFeat, Mem: t.mem.mem, Dirty: t.mem.dirty,
		signal: t.signal, configIntr: t.configChanged, needsResetF: t.setNeedsReset,
	}
	if err := t.dev.Activate(t.env); err != nil {
		return fmt.Errorf("activate device %d: %w", t.dev.DeviceID(), err)
	}
	t.active = true
	return nil
}

// resetLocked is the device reset (status 0). Ordering: stop the device first
// so it no longer touches the queues, then clear transport state.
func (t *PCITransport) resetLocked() {
	if t.active {
		t.dev.Reset()
	}
	t.active = false
	t.env = nil
	for _, q := range t.queues {
		q.reset()
	}
	t.status = 0
	t.driverFeat = 0
	t.devFeatSel, t.drvFeatSel, t.queueSel = 0, 0, 0
	t.configVector.Store(NoVector)
	t.needsReset.Store(false)
	t.isr.Store(0)
	if t.intx != nil {
		_ = t.intx.SetLevel(false)
	}
}

// Reset resets the device as if the driver wrote status 0 (VMM reboot path).
func (t *PCITransport) Reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.resetLocked()
}
