// Package taptest makes taps for tests (as `ip tuntap add mode tap` and
// `ip link set up` would), so tests need no iproute2.
package taptest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// Need skips the test when the machine has no /dev/net/tun or the test is
// not root (making a tap needs CAP_NET_ADMIN), saying so.
func Need(t testing.TB) {
	t.Helper()
	if _, err := os.Stat("/dev/net/tun"); errors.Is(err, os.ErrNotExist) {
		t.Skip("no /dev/net/tun on this machine: the real TAP backend is not tested")
	}
	if os.Geteuid() != 0 {
		t.Skip("not root: cannot make a tap (CAP_NET_ADMIN) to test the real TAP backend")
	}
}

// Make makes a persistent tap named after prefix and the process, up, with
// IPv6 off so the host sends nothing on it by itself; the test's cleanup
// deletes it. extraFlags are added to IFF_TAP|IFF_NO_PI (e.g. IFF_MULTI_QUEUE).
func Make(t testing.TB, prefix string, extraFlags uint16) string {
	t.Helper()
	name := fmt.Sprintf("%s%d", prefix, os.Getpid()%100000)
	for i := 0; exists(name); i++ {
		name = fmt.Sprintf("%s%d_%d", prefix, os.Getpid()%100000, i)
	}
	if len(name) >= unix.IFNAMSIZ {
		t.Fatalf("tap name %q too long", name)
	}
	flags := unix.IFF_TAP | unix.IFF_NO_PI | extraFlags
	fd := Attach(t, name, flags)
	if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
		unix.Close(fd)
		t.Fatalf("TUNSETPERSIST %s: %v", name, err)
	}
	unix.Close(fd)
	t.Cleanup(func() { Delete(name, flags) })
	os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("1"), 0o644)
	if err := SetUp(name); err != nil {
		t.Fatal(err)
	}
	return name
}

func exists(name string) bool {
	_, err := os.Stat(filepath.Join("/sys/class/net", name))
	return err == nil
}

// Attach opens /dev/net/tun and attaches it to the tap name (made if it
// does not exist) with flags; the caller closes the fd.
func Attach(t testing.TB, name string, flags uint16) int {
	t.Helper()
	fd, err := attach(name, flags)
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

func attach(name string, flags uint16) (int, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("TUNSETIFF %s: %w", name, err)
	}
	return fd, nil
}

// Delete removes a persistent tap (attach, clear IFF_PERSIST, close).
func Delete(name string, flags uint16) error {
	fd, err := attach(name, flags)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 0)
}

// SetUp sets the interface up (SIOCSIFFLAGS).
func SetUp(name string) error {
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(s)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(s, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("tap %s flags: %w", name, err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("tap %s up: %w", name, err)
	}
	return nil
}

// SetIPv4 gives the interface an IPv4 address and netmask (SIOCSIFADDR,
// SIOCSIFNETMASK), as `ip addr add ADDR/PREFIX dev NAME` would.
func SetIPv4(name string, addr, mask [4]byte) error {
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(s)
	for _, c := range []struct {
		req uint
		v   [4]byte
	}{{unix.SIOCSIFADDR, addr}, {unix.SIOCSIFNETMASK, mask}} {
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			return err
		}
		if err := ifr.SetInet4Addr(c.v[:]); err != nil {
			return err
		}
		if err := unix.IoctlIfreq(s, c.req, ifr); err != nil {
			return fmt.Errorf("%s: set address %v: %w", name, c.v, err)
		}
	}
	return nil
}
