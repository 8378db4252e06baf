package net

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// TunDevice is the clone device taps are attached through.
const TunDevice = "/dev/net/tun"

// sysClassNet is where an interface's tun_flags are.
const sysClassNet = "/sys/class/net"

// Tap is a Backend over a TAP interface: IFF_TAP|IFF_NO_PI, with
// IFF_VNET_HDR when the tap has it (always when cube-vmm opens it by name).
type Tap struct {
	f        *os.File
	name     string
	vnetHdr  bool
	offloads uint32
}

// CheckTapName refuses what cannot be an interface name.
func CheckTapName(name string) error {
	if name == "" || len(name) >= unix.IFNAMSIZ || name == "." || name == ".." ||
		strings.ContainsAny(name, "/: \t\n") {
		return fmt.Errorf("tap %q: not an interface name (1-%d bytes, no '/', ':' or spaces)", name, unix.IFNAMSIZ-1)
	}
	return nil
}

// tapFlags reads an existing interface's tun flags; it fails for an
// interface that does not exist or is not a tun/tap.
func tapFlags(name string) (uint16, error) {
	if err := CheckTapName(name); err != nil {
		return 0, err
	}
	if _, err := os.Stat(filepath.Join(sysClassNet, name)); err != nil {
		return 0, fmt.Errorf("tap %q: no such interface", name)
	}
	b, err := os.ReadFile(filepath.Join(sysClassNet, name, "tun_flags"))
	if err != nil {
		return 0, fmt.Errorf("tap %q: not a tun/tap interface", name)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 0, 16)
	if err != nil {
		return 0, fmt.Errorf("tap %q: tun_flags %q: %v", name, strings.TrimSpace(string(b)), err)
	}
	if v&unix.IFF_TAP == 0 {
		return 0, fmt.Errorf("tap %q: a tun (layer 3) interface, not a tap", name)
	}
	return uint16(v), nil
}

// CheckTap checks that the interface name exists and is a tap, without
// attaching to it (cube-vmm refuses an unknown tap before making the VM:
// it does not create taps).
func CheckTap(name string) error {
	_, err := tapFlags(name)
	return err
}

// OpenTap attaches to the existing tap name with IFF_VNET_HDR (and
// IFF_MULTI_QUEUE if the tap was made with it).
func OpenTap(name string) (*Tap, error) {
	flags, err := tapFlags(name)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(TunDevice, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("tap %q: open %s: %w", name, TunDevice, err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tap %q: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR | flags&unix.IFF_MULTI_QUEUE)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		switch {
		case errors.Is(err, unix.EBUSY):
			return nil, fmt.Errorf("tap %q: attached to another process (TUNSETIFF: %w)", name, err)
		case errors.Is(err, unix.EPERM):
			return nil, fmt.Errorf("tap %q: not permitted (owned by another user or group, or no CAP_NET_ADMIN: %w)", name, err)
		}
		return nil, fmt.Errorf("tap %q: TUNSETIFF: %w", name, err)
	}
	t, err := newTap(fd, name, true)
	if err != nil {
		return nil, fmt.Errorf("tap %q: %w", name, err)
	}
	return t, nil
}

// tapFromFD reads an attached tun fd's name and flags (TUNGETIFF).
func tapFromFD(fd int) (name string, flags uint16, err error) {
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return "", 0, err
	}
	if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr); err != nil {
		return "", 0, fmt.Errorf("fd %d is not an attached tap (TUNGETIFF: %w)", fd, err)
	}
	flags = ifr.Uint16()
	if flags&unix.IFF_TAP == 0 {
		return "", 0, fmt.Errorf("fd %d is a tun (layer 3) device %q, not a tap", fd, ifr.Name())
	}
	if flags&unix.IFF_NO_PI == 0 {
		return "", 0, fmt.Errorf("fd %d: tap %q was attached without IFF_NO_PI", fd, ifr.Name())
	}
	return ifr.Name(), flags, nil
}

// CheckTapFD checks that fd is a tap attached by the caller (IFF_TAP,
// IFF_NO_PI), without taking it.
func CheckTapFD(fd int) error {
	if fd < 3 {
		return fmt.Errorf("fd %d: 0-2 are stdio, not a tap", fd)
	}
	_, _, err := tapFromFD(fd)
	return err
}

// TapFromFD takes over a tap fd the caller attached (inherited, e.g.
// exec's ExtraFiles). Without IFF_VNET_HDR on it the device runs without
// offloads.
func TapFromFD(fd int) (*Tap, error) {
	if err := CheckTapFD(fd); err != nil {
		return nil, err
	}
	name, flags, _ := tapFromFD(fd)
	unix.CloseOnExec(fd)
	t, err := newTap(fd, name, flags&unix.IFF_VNET_HDR != 0)
	if err != nil {
		return nil, fmt.Errorf("fd %d (tap %q): %w", fd, name, err)
	}
	return t, nil
}

// newTap sets the header size, probes the offloads the tap takes (then
// turns them off until a driver negotiates) and wraps fd (closed on error).
func newTap(fd int, name string, vnetHdr bool) (*Tap, error) {
	t := &Tap{name: name, vnetHdr: vnetHdr}
	if vnetHdr {
		if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, HeaderLen); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("TUNSETVNETHDRSZ %d: %w", HeaderLen, err)
		}
		for _, f := range []uint32{TunFCsum | TunFTSO4 | TunFTSO6 | TunFTSOECN, TunFCsum | TunFTSO4 | TunFTSO6, TunFCsum} {
			if unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, int(f)) == nil {
				t.offloads = f
				break
			}
		}
		if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, 0); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("TUNSETOFFLOAD 0: %w", err)
		}
	}
	// Non-blocking, so the file is on Go's poller and Close ends a Read.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	t.f = os.NewFile(uintptr(fd), "tap:"+name)
	return t, nil
}

// Name is the tap's interface name.
func (t *Tap) Name() string { return t.name }

// ReadFrame implements Backend.
func (t *Tap) ReadFrame(p []byte) (int, error) { return t.f.Read(p) }

// WriteFrame implements Backend.
func (t *Tap) WriteFrame(p []byte) error {
	n, err := t.f.Write(p)
	if err == nil && n != len(p) {
		err = fmt.Errorf("short write to tap %s: %d of %d bytes", t.name, n, len(p))
	}
	return err
}

// VnetHdr implements Backend.
func (t *Tap) VnetHdr() bool { return t.vnetHdr }

// Offloads implements Backend.
func (t *Tap) Offloads() uint32 { return t.offloads }

// SetOffloads implements Backend (TUNSETOFFLOAD).
func (t *Tap) SetOffloads(tun uint32) error {
	if tun&^t.offloads != 0 {
		return fmt.Errorf("tap %s: offloads %#x not supported (%#x)", t.name, tun, t.offloads)
	}
	rc, err := t.f.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) { ierr = unix.IoctlSetInt(int(fd), unix.TUNSETOFFLOAD, int(tun)) }); err != nil {
		return err
	}
	return ierr
}

// Close implements Backend: the tap is detached (a persistent tap stays).
func (t *Tap) Close() error { return t.f.Close() }
