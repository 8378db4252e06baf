package netif

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Loopback is the name of the loopback interface.
const Loopback = "lo"

// LoopbackUp brings Loopback up in the calling thread's network namespace
// (the kernel then gives it 127.0.0.1/8 and ::1). It reports whether lo was
// already up; bringing it up twice is harmless.
func LoopbackUp() (wasUp bool, err error) { return Up(Loopback) }

// Up sets IFF_UP on interface name in the calling thread's network
// namespace and reports whether it was already up. Callers that changed
// their thread's namespace (setns, unshare) must hold it with
// runtime.LockOSThread.
func Up(name string) (wasUp bool, err error) {
	fd, ifr, err := open(name)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	flags, err := getFlags(fd, ifr)
	if err != nil {
		return false, err
	}
	if flags&unix.IFF_UP != 0 {
		return true, nil
	}
	ifr.SetUint16(flags | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		if errors.Is(err, unix.EPERM) {
			return false, fmt.Errorf("interface %s: set up (SIOCSIFFLAGS) needs CAP_NET_ADMIN: %w", name, err)
		}
		return false, fmt.Errorf("interface %s: set up (SIOCSIFFLAGS): %w", name, err)
	}
	return false, nil
}

// IsUp reports whether interface name has IFF_UP in the calling thread's
// network namespace.
func IsUp(name string) (bool, error) {
	fd, ifr, err := open(name)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	flags, err := getFlags(fd, ifr)
	return flags&unix.IFF_UP != 0, err
}

// open makes the request for name and the socket to send it on. A socket
// belongs to the network namespace of the thread creating it, and the
// interface ioctls act on that namespace.
func open(name string) (int, *unix.Ifreq, error) {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return -1, nil, fmt.Errorf("interface %q: %w", name, err)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, nil, fmt.Errorf("interface %s: socket(AF_INET, SOCK_DGRAM): %w", name, err)
	}
	return fd, ifr, nil
}

func getFlags(fd int, ifr *unix.Ifreq) (uint16, error) {
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		if errors.Is(err, unix.ENODEV) {
			return 0, fmt.Errorf("interface %s: no such interface in this network namespace: %w", ifr.Name(), err)
		}
		return 0, fmt.Errorf("interface %s: SIOCGIFFLAGS: %w", ifr.Name(), err)
	}
	return ifr.Uint16(), nil
}
