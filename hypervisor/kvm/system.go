package kvm

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DefaultDevice is where the KVM system device lives.
const DefaultDevice = "/dev/kvm"

// System is an open KVM system device (/dev/kvm).
type System struct {
	fd       int
	mmapSize int
}

// Open opens the KVM device at path, checks the API version and reads the
// vCPU mmap size. The returned error wraps the open(2) error, so callers can
// test errors.Is(err, fs.ErrNotExist) / unix.ENOENT.
func Open(path string) (*System, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("kvm: open %s: %w", path, err)
	}
	s := &System{fd: fd}
	v, err := ioctlArg(fd, kvmGetAPIVersion, 0)
	if err != nil {
		s.Close()
		return nil, wrap("KVM_GET_API_VERSION", err)
	}
	if v != APIVersion {
		s.Close()
		return nil, fmt.Errorf("kvm: %s reports API version %d, want %d", path, v, APIVersion)
	}
	sz, err := ioctlArg(fd, kvmGetVCPUMmapSize, 0)
	if err != nil {
		s.Close()
		return nil, wrap("KVM_GET_VCPU_MMAP_SIZE", err)
	}
	// The kvm_run page must at least hold the fixed header and exit union.
	if sz < runExitUnion+runExitUnionSize || sz > 1<<20 {
		s.Close()
		return nil, fmt.Errorf("kvm: implausible vcpu mmap size %d", sz)
	}
	s.mmapSize = int(sz)
	return s, nil
}

// Close releases the device. VMs created from it stay valid.
func (s *System) Close() error {
	if s.fd < 0 {
		return nil
	}
	err := unix.Close(s.fd)
	s.fd = -1
	return err
}

// FD returns the raw descriptor.
func (s *System) FD() int { return s.fd }

// VCPUMmapSize is the size of each vCPU's shared kvm_run region.
func (s *System) VCPUMmapSize() int { return s.mmapSize }

// CheckExtension returns KVM_CHECK_EXTENSION's answer for cap (0: absent).
func (s *System) CheckExtension(cap int) (int, error) {
	if s.fd < 0 {
		return 0, ErrClosed
	}
	r, err := ioctlArg(s.fd, kvmCheckExtension, uintptr(cap))
	if err != nil {
		return 0, wrap(fmt.Sprintf("KVM_CHECK_EXTENSION %d", cap), err)
	}
	return int(r), nil
}

// MSRIndexList returns the MSRs KVM saves/restores for a vCPU (the list a
// snapshot must cover).
func (s *System) MSRIndexList() ([]uint32, error) {
	if s.fd < 0 {
		return nil, ErrClosed
	}
	// Ask with room for n entries; E2BIG means the kernel wrote the needed
	// count into nmsrs, so retry once with that size.
	n := uint32(256)
	for try := 0; try < 2; try++ {
		buf := make([]uint32, 1+n)
		buf[0] = n
		_, err := ioctlPtr(s.fd, kvmGetMSRIndexList, unsafe.Pointer(&buf[0]))
		if err == unix.E2BIG && try == 0 && buf[0] > n && buf[0] <= 1<<16 {
			n = buf[0]
			continue
		}
		if err != nil {
			return nil, wrap("KVM_GET_MSR_INDEX_LIST", err)
		}
		got := buf[0]
		if got > n {
			return nil, fmt.Errorf("kvm: KVM_GET_MSR_INDEX_LIST returned %d entries for a buffer of %d", got, n)
		}
		return append([]uint32(nil), buf[1:1+got]...), nil
	}
	return nil, fmt.Errorf("kvm: KVM_GET_MSR_INDEX_LIST: list keeps growing")
}

// SupportedCPUID returns KVM_GET_SUPPORTED_CPUID.
func (s *System) SupportedCPUID() ([]CPUIDEntry2, error) {
	if s.fd < 0 {
		return nil, ErrClosed
	}
	buf := newCPUID2(MaxCPUIDEntries)
	if _, err := ioctlPtr(s.fd, kvmGetSupportedCPUID, unsafe.Pointer(&buf[0])); err != nil {
		return nil, wrap("KVM_GET_SUPPORTED_CPUID", err)
	}
	return cpuid2Entries(buf)
}

// CreateVM creates a VM (type 0: the default x86 VM).
func (s *System) CreateVM() (*VM, error) {
	if s.fd < 0 {
		return nil, ErrClosed
	}
	fd, err := ioctlArg(s.fd, kvmCreateVM, 0)
	if err != nil {
		return nil, wrap("KVM_CREATE_VM", err)
	}
	unix.CloseOnExec(int(fd))
	return &VM{fd: int(fd), sys: s, mmapSize: s.mmapSize}, nil
}

// cpuid2 buffers are []uint32: an 8-byte header (nent, padding) followed by
// nent 40-byte entries, all 4-byte aligned as the kernel expects.
const cpuidEntryWords = int(unsafe.Sizeof(CPUIDEntry2{}) / 4)

func newCPUID2(n int) []uint32 {
	buf := make([]uint32, 2+n*cpuidEntryWords)
	buf[0] = uint32(n)
	return buf
}

func cpuid2Entries(buf []uint32) ([]CPUIDEntry2, error) {
	max := (len(buf) - 2) / cpuidEntryWords
	n := int(buf[0])
	if n > max {
		return nil, fmt.Errorf("kvm: cpuid2 reports %d entries for a buffer of %d", n, max)
	}
	out := make([]CPUIDEntry2, n)
	for i := range out {
		out[i] = *(*CPUIDEntry2)(unsafe.Pointer(&buf[2+i*cpuidEntryWords]))
	}
	return out, nil
}

func cpuid2Buffer(entries []CPUIDEntry2) ([]uint32, error) {
	if len(entries) > MaxCPUIDEntries {
		return nil, fmt.Errorf("kvm: %d cpuid entries exceed the limit of %d", len(entries), MaxCPUIDEntries)
	}
	buf := newCPUID2(len(entries))
	for i := range entries {
		*(*CPUIDEntry2)(unsafe.Pointer(&buf[2+i*cpuidEntryWords])) = entries[i]
	}
	return buf, nil
}
