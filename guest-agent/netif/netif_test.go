package netif

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestUpUnknownInterface(t *testing.T) {
	// SIOCGIFFLAGS needs no privilege: this runs as any user.
	_, err := Up("cube-nosuch0")
	if !errors.Is(err, unix.ENODEV) || !strings.Contains(err.Error(), "cube-nosuch0") {
		t.Fatalf("Up of a missing interface: %v, want ENODEV naming it", err)
	}
}

func TestUpBadName(t *testing.T) {
	// IFNAMSIZ is 16 with the NUL: a 16-byte name does not fit an ifreq.
	if _, err := Up(strings.Repeat("x", 16)); err == nil {
		t.Fatal("a 16-byte interface name was accepted")
	}
}

func TestUpAlreadyUp(t *testing.T) {
	up, err := IsUp(Loopback)
	if err != nil {
		t.Fatal(err)
	}
	if !up {
		t.Skip("lo is down in this test's network namespace: nothing to check without changing it (TestLoopbackUpNewNetns does, as root)")
	}
	// Already up: no SIOCSIFFLAGS, so no privilege needed.
	wasUp, err := LoopbackUp()
	if err != nil || !wasUp {
		t.Fatalf("LoopbackUp with lo up = %v, %v; want true, nil", wasUp, err)
	}
}

// TestLoopbackUpNewNetns unshares a network namespace on a locked thread (lo
// starts down there, as in the guest), brings lo up and serves TCP on
// 127.0.0.1 in it.
func TestLoopbackUpNewNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: unshare(CLONE_NEWNET) needs CAP_SYS_ADMIN and setting lo up CAP_NET_ADMIN (make test runs this as root)")
	}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread, left in the new namespace, ends with the goroutine.
		runtime.LockOSThread()
		errc <- inNewNetns(t)
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func inNewNetns(t *testing.T) error {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return err
	}
	if up, err := IsUp(Loopback); err != nil || up {
		return errors.New("lo of a new network namespace is not down: " + errString(err))
	}
	// What a sandbox used to meet: a server listens on 127.0.0.1 with lo
	// down, but its clients get "network is unreachable".
	if l, err := net.Listen("tcp4", "127.0.0.1:0"); err == nil {
		c, err := net.Dial("tcp4", l.Addr().String())
		if err == nil {
			c.Close()
			t.Error("a dial to 127.0.0.1 with lo down succeeded")
		} else if !errors.Is(err, unix.ENETUNREACH) {
			t.Logf("dial to 127.0.0.1 with lo down: %v (expected ENETUNREACH)", err)
		}
		l.Close()
	}
	wasUp, err := LoopbackUp()
	if err != nil {
		return err
	}
	if wasUp {
		t.Error("LoopbackUp in a new namespace reported lo already up")
	}
	if up, err := IsUp(Loopback); err != nil || !up {
		return errors.New("lo not up after LoopbackUp: " + errString(err))
	}
	if wasUp, err := LoopbackUp(); err != nil || !wasUp {
		t.Errorf("second LoopbackUp = %v, %v; want true, nil", wasUp, err)
	}
	// Sockets are made on this (locked) thread, so in the new namespace.
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.Write([]byte("over loopback"))
			c.Close()
		}
	}()
	c, err := net.Dial("tcp4", l.Addr().String())
	if err != nil {
		return err
	}
	defer c.Close()
	b, err := io.ReadAll(c)
	if err != nil || string(b) != "over loopback" {
		t.Errorf("reply over 127.0.0.1: %q, %v", b, err)
	}
	return nil
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}
