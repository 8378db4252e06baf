package machine

import (
	"errors"
	"fmt"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/hypervisor/virtio/blk"
)

// ErrNoDisk is returned by SetDisk for a serial no disk has.
var ErrNoDisk = errors.New("no such disk")

// SetDisk re-points the virtio-blk disk whose serial is serial at the file
// path: a media change, as a drive slot gets a container's rootfs image
// (or goes back to its stub). The file is opened with the disk's mode
// (read-only disks stay read-only). The disk's transport is paused around
// the swap, so no request runs half on the old file and kicks that arrive
// meanwhile run on the new one; the guest gets a config-change interrupt
// and re-reads the capacity. Serialized with pause, snapshot and rollback.
// Returns the new capacity in 512-byte sectors.
func (m *Machine) SetDisk(serial, path string) (uint64, error) {
	return m.SetDiskMode(serial, path, false)
}

// SetDiskMode is SetDisk with readOnly: the new medium is opened read-only
// and the disk fails writes to it with IOERR (a read-only raw block volume).
func (m *Machine) SetDiskMode(serial, path string, readOnly bool) (uint64, error) {
	if serial == "" {
		return 0, errors.New("set disk: empty serial")
	}
	m.ctl.Lock()
	defer m.ctl.Unlock()
	if st := m.State(); st == Stopped {
		return 0, fmt.Errorf("set disk %q: machine is %v", serial, st)
	}
	var (
		found *virtioDev
		have  []string
	)
	for i := range m.virtio {
		d, ok := m.virtio[i].dev.(*blk.Device)
		if !ok {
			continue
		}
		have = append(have, d.Serial())
		if d.Serial() == serial && found == nil {
			found = &m.virtio[i]
		}
	}
	if found == nil {
		return 0, fmt.Errorf("set disk %q: %w (disks: %s)", serial, ErrNoDisk, strings.Join(have, ", "))
	}
	dev := found.dev.(*blk.Device)
	old := dev.Path()
	// Quiesce: wait for the kick in progress, park new ones until Resume
	// replays them against the new file.
	found.tr.Pause()
	sectors, err := dev.SetBackingMode(path, readOnly)
	found.tr.Resume()
	if err != nil {
		return 0, fmt.Errorf("set disk %q: %w", serial, err)
	}
	m.log.WithFields(logrus.Fields{"serial": serial, "old": old, "new": path, "sectors": sectors, "read_only": readOnly}).Info("disk re-pointed")
	return sectors, nil
}
