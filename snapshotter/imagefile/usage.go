package imagefile

import (
	"encoding/binary"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FIEMAP ABI (linux/fiemap.h). x/sys/unix does not wrap it.
const (
	fsIocFiemap       = 0xC020660B // _IOWR('f', 11, struct fiemap)
	fiemapFlagSync    = 0x1
	fiemapExtentLast  = 0x1
	fiemapExtentShare = 0x2000
	fiemapHeaderSize  = 32
	fiemapExtentSize  = 56
	fiemapBatch       = 256
)

type fiemapExtent struct {
	logical, length uint64
	flags           uint32
}

// parseFiemap decodes a FIEMAP reply buffer. The kernel fills it, but it is
// still bounds-checked: mapped may not exceed what the buffer can hold.
func parseFiemap(buf []byte) ([]fiemapExtent, error) {
	if len(buf) < fiemapHeaderSize {
		return nil, fmt.Errorf("fiemap: short buffer %d", len(buf))
	}
	mapped := binary.NativeEndian.Uint32(buf[20:24])
	if uint64(mapped) > uint64(len(buf)-fiemapHeaderSize)/fiemapExtentSize {
		return nil, fmt.Errorf("fiemap: %d extents do not fit a %d-byte buffer", mapped, len(buf))
	}
	ext := make([]fiemapExtent, mapped)
	for i := range ext {
		e := buf[fiemapHeaderSize+i*fiemapExtentSize:]
		ext[i] = fiemapExtent{
			logical: binary.NativeEndian.Uint64(e[0:8]),
			length:  binary.NativeEndian.Uint64(e[16:24]),
			flags:   binary.NativeEndian.Uint32(e[40:44]),
		}
	}
	return ext, nil
}

// Exclusive returns the bytes of path's allocated extents that are not shared
// with another file (reflinked extents are shared). This is the disk space
// removing the file would free, which is what snapshot Usage means.
func Exclusive(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("usage %s: %w", path, err)
	}
	defer f.Close()
	buf := make([]byte, fiemapHeaderSize+fiemapBatch*fiemapExtentSize)
	var (
		start uint64
		total int64
		flags uint32 = fiemapFlagSync
	)
	for {
		clear(buf)
		binary.NativeEndian.PutUint64(buf[0:8], start)
		binary.NativeEndian.PutUint64(buf[8:16], ^uint64(0)-start)
		binary.NativeEndian.PutUint32(buf[16:20], flags)
		binary.NativeEndian.PutUint32(buf[24:28], fiemapBatch)
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0]))); errno != 0 {
			if errno == unix.EOPNOTSUPP || errno == unix.ENOTTY {
				// No extent map (e.g. tmpfs): nothing can be shared, so all allocated bytes are ours.
				return Allocated(path)
			}
			return 0, fmt.Errorf("usage %s: FIEMAP: %w", path, errno)
		}
		flags = 0 // one sync is enough
		ext, err := parseFiemap(buf)
		if err != nil {
			return 0, fmt.Errorf("usage %s: %w", path, err)
		}
		if len(ext) == 0 {
			return total, nil
		}
		for _, e := range ext {
			if e.flags&fiemapExtentShare == 0 {
				total += int64(e.length)
			}
			if e.flags&fiemapExtentLast != 0 {
				return total, nil
			}
		}
		last := ext[len(ext)-1]
		next := last.logical + last.length
		if next <= start {
			return 0, fmt.Errorf("usage %s: FIEMAP did not advance at offset %d", path, start)
		}
		start = next
	}
}

// Superblock holds the ext4 superblock fields the snapshotter reports.
type Superblock struct {
	InodesCount     uint32
	FreeInodesCount uint32
	BlocksCount     uint64
	FreeBlocksCount uint64
	BlockSize       uint32
}

const (
	superblockOffset = 1024
	superblockSize   = 1024
	ext4Magic        = 0xEF53
	incompat64bit    = 0x80
)

// UsedInodes is the number of inodes in use according to the superblock.
func (s Superblock) UsedInodes() int64 {
	if s.FreeInodesCount > s.InodesCount {
		return 0
	}
	return int64(s.InodesCount - s.FreeInodesCount)
}

// ParseSuperblock decodes the 1024-byte ext2/3/4 superblock. The image is
// written by containers (untrusted), so every field is range-checked.
func ParseSuperblock(b []byte) (Superblock, error) {
	if len(b) < superblockSize {
		return Superblock{}, fmt.Errorf("ext4 superblock: short read %d", len(b))
	}
	le := binary.LittleEndian
	if m := le.Uint16(b[56:58]); m != ext4Magic {
		return Superblock{}, fmt.Errorf("ext4 superblock: bad magic %#x", m)
	}
	logBlock := le.Uint32(b[24:28])
	if logBlock > 6 { // 1 KiB << 6 = 64 KiB, the largest ext4 block size
		return Superblock{}, fmt.Errorf("ext4 superblock: block size log %d out of range", logBlock)
	}
	s := Superblock{
		InodesCount:     le.Uint32(b[0:4]),
		BlocksCount:     uint64(le.Uint32(b[4:8])),
		FreeBlocksCount: uint64(le.Uint32(b[12:16])),
		FreeInodesCount: le.Uint32(b[16:20]),
		BlockSize:       1024 << logBlock,
	}
	if le.Uint32(b[96:100])&incompat64bit != 0 {
		s.BlocksCount |= uint64(le.Uint32(b[0x150:0x154])) << 32
		s.FreeBlocksCount |= uint64(le.Uint32(b[0x158:0x15c])) << 32
	}
	if s.FreeInodesCount > s.InodesCount || s.FreeBlocksCount > s.BlocksCount {
		return Superblock{}, fmt.Errorf("ext4 superblock: free counts exceed totals")
	}
	return s, nil
}

// ReadSuperblock reads and parses the superblock of the image at path.
func ReadSuperblock(path string) (Superblock, error) {
	f, err := os.Open(path)
	if err != nil {
		return Superblock{}, fmt.Errorf("read superblock: %w", err)
	}
	defer f.Close()
	b := make([]byte, superblockSize)
	if _, err := f.ReadAt(b, superblockOffset); err != nil {
		return Superblock{}, fmt.Errorf("read superblock of %s: %w", path, err)
	}
	sb, err := ParseSuperblock(b)
	if err != nil {
		return Superblock{}, fmt.Errorf("%s: %w", path, err)
	}
	return sb, nil
}
