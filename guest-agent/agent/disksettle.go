package agent

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A drive slot's backing file is swapped by the VMM at run time (cube-vmm
// disk-set): the same /dev/vdX then has other bytes and, usually, another
// size. Linux's virtio_blk learns the new capacity from a config-change
// interrupt, handled in a workqueue: MountDisk can run before that, and a
// mount against the old (stub-sized) capacity fails ("block count exceeds
// size of device"). And pages of the old disk still in the block device's
// page cache (someone held it open across the swap) would be read as if
// they were the new disk's. So before mounting, settleDisk drops the
// device's cached pages (BLKFLSBUF) and, for ext2/3/4, waits until the
// device is as large as the file system its superblock describes.

// defaultDiskSettle bounds the wait for the capacity change to arrive.
const defaultDiskSettle = 10 * time.Second

// ext superblock fields (offsets inside the superblock at byte 1024).
const (
	extSuperOffset    = 1024
	extMagicOff       = 0x38
	extMagic          = 0xEF53
	extBlocksLoOff    = 0x04
	extLogBlockOff    = 0x18
	extIncompatOff    = 0x60
	extBlocksHiOff    = 0x150
	extIncompat64Bit  = 0x80
	extSuperblockSize = 1024
)

// extFSBytes returns the size in bytes of the ext2/3/4 file system whose
// superblock is sb, or ok=false when sb is not one.
func extFSBytes(sb []byte) (n uint64, ok bool) {
	if len(sb) < extSuperblockSize || binary.LittleEndian.Uint16(sb[extMagicOff:]) != extMagic {
		return 0, false
	}
	logBlock := binary.LittleEndian.Uint32(sb[extLogBlockOff:])
	if logBlock > 6 { // blocks of 1 KiB..64 KiB only
		return 0, false
	}
	blocks := uint64(binary.LittleEndian.Uint32(sb[extBlocksLoOff:]))
	if binary.LittleEndian.Uint32(sb[extIncompatOff:])&extIncompat64Bit != 0 {
		blocks |= uint64(binary.LittleEndian.Uint32(sb[extBlocksHiOff:])) << 32
	}
	bs := uint64(1024) << logBlock
	if blocks > ^uint64(0)/bs {
		return 0, false
	}
	return blocks * bs, true
}

func blkSize(fd int) (uint64, error) {
	var n uint64
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&n))); e != 0 {
		return 0, e
	}
	return n, nil
}

// settleDisk readies dev (not mounted) for mounting its current contents;
// see above. Other file systems get only the cache flush.
func (s *Service) settleDisk(ctx context.Context, dev, fstype string) error {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dev, err)
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, unix.BLKFLSBUF, 0); err != nil {
		return fmt.Errorf("drop cached blocks of %s (BLKFLSBUF): %w", dev, err)
	}
	if fstype != "ext4" && fstype != "ext3" && fstype != "ext2" {
		return nil
	}
	timeout := s.cfg.DiskSettleTimeout
	if timeout <= 0 {
		timeout = defaultDiskSettle
	}
	t0 := time.Now()
	deadline := t0.Add(timeout)
	settled := func() error {
		if waited := time.Since(t0); waited > 5*time.Millisecond {
			// Worth seeing: the capacity change arrived after MountDisk.
			s.log.WithField("device", dev).WithField("waited", waited).Debug("disk capacity settled")
		}
		return nil
	}
	sb := make([]byte, extSuperblockSize)
	var size uint64
	// Each round is a page cache read and an ioctl: poll often (a change
	// that arrives 33 ms in was seen 63 ms in with a 1–50 ms backoff).
	for delay := time.Millisecond; ; delay = min(2*delay, 4*time.Millisecond) {
		// Read the superblock each round: with a stale capacity below 2 KiB
		// the read itself fails until the change arrives.
		n, rerr := unix.Pread(fd, sb, extSuperOffset)
		fsBytes, isExt := extFSBytes(sb[:max(n, 0)])
		size, err = blkSize(fd)
		if err != nil {
			return fmt.Errorf("size of %s: %w", dev, err)
		}
		switch {
		case rerr == nil && n == len(sb) && !isExt:
			return nil // not ext: let mount report it
		case isExt && size >= fsBytes:
			return settled()
		}
		why := fmt.Sprintf("its superblock is unreadable (%v)", rerr)
		if isExt {
			why = fmt.Sprintf("its ext file system needs %d", fsBytes)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is %d bytes and %s: the disk's new capacity did not reach the guest within %v", dev, size, why, timeout)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the capacity of %s (%d bytes, %s): %w", dev, size, why, ctx.Err())
		case <-time.After(delay):
		}
	}
}
