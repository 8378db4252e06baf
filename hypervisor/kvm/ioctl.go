// Package kvm is the Linux KVM ABI in Go: the system, VM and vCPU ioctls a VMM
// needs, with the kernel's structs mirrored field for field (layouts are
// checked against <linux/kvm.h> by layout_test.go).
//
// Nothing here interprets guest state; it only moves it across the ioctl
// boundary with bounds checks on every variable-length buffer.
package kvm

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ioctl request encoding, from <asm-generic/ioctl.h>.
const (
	iocNone  = 0
	iocWrite = 1
	iocRead  = 2

	iocNRShift   = 0
	iocTypeShift = 8
	iocSizeShift = 16
	iocDirShift  = 30

	kvmio = 0xAE
)

func ioc(dir, nr, size uintptr) uintptr {
	return dir<<iocDirShift | kvmio<<iocTypeShift | nr<<iocNRShift | size<<iocSizeShift
}

func io(nr uintptr) uintptr         { return ioc(iocNone, nr, 0) }
func ior(nr, size uintptr) uintptr  { return ioc(iocRead, nr, size) }
func iow(nr, size uintptr) uintptr  { return ioc(iocWrite, nr, size) }
func iowr(nr, size uintptr) uintptr { return ioc(iocRead|iocWrite, nr, size) }

// ioctlArg issues an ioctl whose argument is a plain integer. EINTR is
// retried: none of these calls has side effects that a retry would repeat.
func ioctlArg(fd int, req, arg uintptr) (uintptr, error) {
	for {
		r, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, arg)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return r, e
		}
		return r, nil
	}
}

// ioctlPtr issues an ioctl whose argument points at Go memory. The pointer
// is converted to uintptr inside the Syscall call expression so the object
// stays live and unmoved for the duration of the call.
func ioctlPtr(fd int, req uintptr, p unsafe.Pointer) (uintptr, error) {
	for {
		r, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(p))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return r, e
		}
		return r, nil
	}
}

// ErrClosed is returned by methods called after Close.
var ErrClosed = errors.New("kvm: file descriptor closed")

func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("kvm: %s: %w", op, err)
}
