package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Finding a disk by serial. The VMM gives each drive slot a fixed virtio
// serial (cube-slot-N) for the VM's life: cube-vmm's disk-set swaps the
// slot's backing file, never its device. So the serial → device mapping one
// scan of SysBlock finds is kept (diskNames), and a lookup that finds its
// serial there only checks that the device is still the one it was (its
// sysfs link, which names the bus address: no I/O), instead of listing every
// block device and reading each one's serial. Reading a virtio-blk serial is
// a request to the device (GET_ID): after a template restore the scan took
// 92–123 ms of the first mount in the test host's guest (single runs), the
// cached lookup 4–40 ms. The agent of a template has scanned before the snapshot
// (PrepareSpare, warmDisks). Where SysBlock's entries are not links (tests),
// the check reads the serial.

// findDisk returns the device node of the block device whose sysfs serial
// (virtio-blk: the id the VMM gave the disk) is serial.
func (s *Service) findDisk(serial string) (string, error) {
	s.diskNamesMu.Lock()
	d, ok := s.diskNames[serial]
	s.diskNamesMu.Unlock()
	if !ok || !s.stillDisk(d, serial) {
		names, err := s.scanDisks()
		if err != nil {
			return "", err
		}
		s.diskNamesMu.Lock()
		d, ok = s.diskNames[serial]
		s.diskNamesMu.Unlock()
		if !ok {
			return "", errNotFound("no block device with serial %q (devices: %s)", serial, strings.Join(names, ", "))
		}
	}
	name := d.name
	dev := filepath.Join(s.cfg.DevDir, name)
	if _, err := os.Stat(dev); err != nil {
		// devtmpfs normally creates it; fall back to the sysfs dev number.
		if err := mknodFromSys(filepath.Join(s.cfg.SysBlock, name, "dev"), dev); err != nil {
			return "", toStatus(err, "device node for disk %q", serial)
		}
	}
	return dev, nil
}

// diskName is a block device as a scan found it: its name and its sysfs
// link ("" where the entry is not a link).
type diskName struct{ name, link string }

// stillDisk says whether d is still the device with serial.
func (s *Service) stillDisk(d diskName, serial string) bool {
	if d.link == "" {
		return s.sysSerial(d.name) == serial
	}
	l, err := os.Readlink(filepath.Join(s.cfg.SysBlock, d.name))
	return err == nil && l == d.link
}

// sysSerial is block device name's serial, "" when it has none (or is gone).
func (s *Service) sysSerial(name string) string {
	b, err := os.ReadFile(filepath.Join(s.cfg.SysBlock, name, "serial"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// scanDisks reads the serial of every block device into diskNames (which
// it replaces: a device gone takes its serial with it) and returns the
// names of all of them.
func (s *Service) scanDisks() ([]string, error) {
	ents, err := os.ReadDir(s.cfg.SysBlock)
	if err != nil {
		return nil, toStatus(err, "list block devices")
	}
	found := map[string]diskName{}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
		if serial := s.sysSerial(e.Name()); serial != "" {
			link, _ := os.Readlink(filepath.Join(s.cfg.SysBlock, e.Name()))
			found[serial] = diskName{e.Name(), link}
		}
	}
	s.diskNamesMu.Lock()
	s.diskNames = found
	s.diskNamesMu.Unlock()
	return names, nil
}

// warmDisks scans the block devices before a template's snapshot, so that
// the sandboxes restored from it find their disks without a scan. A
// failure only costs them the scan.
func (s *Service) warmDisks() {
	if _, err := s.scanDisks(); err != nil {
		s.log.WithError(err).Debug("block device scan before the snapshot failed")
	}
}

func mknodFromSys(devFile, node string) error {
	b, err := os.ReadFile(devFile)
	if err != nil {
		return err
	}
	var maj, min uint32
	if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d:%d", &maj, &min); err != nil {
		return fmt.Errorf("parse %s: %w", devFile, err)
	}
	return unix.Mknod(node, unix.S_IFBLK|0o600, int(unix.Mkdev(maj, min)))
}
