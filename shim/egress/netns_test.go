package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// nsThread is a locked OS thread in a network namespace of its own; do runs
// functions on it (sockets made there belong to the namespace).
type nsThread struct {
	path string
	fns  chan func()
}

func newNSThread(t *testing.T) *nsThread {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, veths and nftables need CAP_SYS_ADMIN and CAP_NET_ADMIN (make test runs this as root)")
	}
	n := &nsThread{fns: make(chan func())}
	ready := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with its namespace
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ready <- err
			return
		}
		n.path = fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		ready <- nil
		for f := range n.fns {
			f()
		}
	}()
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(n.fns) })
	return n
}

func (n *nsThread) do(t *testing.T, f func() error) {
	t.Helper()
	errc := make(chan error, 1)
	n.fns <- func() { errc <- f() }
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestFilterEnforces is the filter against the kernel's nftables, without
// a VM: a "sandbox" namespace with eth0 (10.99.0.5/24) whose veth peer
// "host0" is in a "host" namespace with two addresses, 10.99.0.1 and
// 10.99.0.2, a UDP listener on each. The filter on host0's ingress lets
// through only what the policy allows, counts what it drops, follows a
// policy change, and Remove (and an open policy) leaves no table.
func TestFilterEnforces(t *testing.T) {
	sb, host := newNSThread(t), newNSThread(t)
	host.do(t, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "host0"}, PeerName: "eth0"}); err != nil {
			return err
		}
		l, _ := netlink.LinkByName("host0")
		for _, a := range []string{"10.99.0.1/24", "10.99.0.2/24"} {
			ad, _ := netlink.ParseAddr(a)
			if err := netlink.AddrAdd(l, ad); err != nil {
				return err
			}
		}
		fd, err := unix.Open(sb.path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		p, _ := netlink.LinkByName("eth0")
		if err := netlink.LinkSetNsFd(p, fd); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	sb.do(t, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		ad, _ := netlink.ParseAddr("10.99.0.5/24")
		if err := netlink.AddrAdd(l, ad); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	servers := map[string]*net.UDPConn{}
	host.do(t, func() error {
		for _, ip := range []string{"10.99.0.1", "10.99.0.2"} {
			c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(ip), Port: 9999})
			if err != nil {
				return err
			}
			t.Cleanup(func() { c.Close() })
			servers[ip] = c
		}
		return nil
	})
	var client *net.UDPConn
	sb.do(t, func() error {
		var err error
		client, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP("10.99.0.5")})
		return err
	})
	t.Cleanup(func() { client.Close() })
	// reached sends datagrams to ip from the sandbox and says whether ip's
	// server got one of them (retried for ARP: the first may wait on it).
	// Each call's datagrams carry their own sequence number: one that
	// arrived late for an earlier call does not count.
	seq := 0
	reached := func(ip string) bool {
		seq++
		want := fmt.Sprintf("hi %d", seq)
		buf := make([]byte, 64)
		for range 3 {
			if _, err := client.WriteToUDP([]byte(want), &net.UDPAddr{IP: net.ParseIP(ip), Port: 9999}); err != nil {
				t.Fatal(err)
			}
			servers[ip].SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			for {
				n, _, err := servers[ip].ReadFromUDP(buf)
				if err != nil {
					break
				}
				if string(buf[:n]) == want {
					return true
				}
			}
		}
		return false
	}
	if !reached("10.99.0.1") || !reached("10.99.0.2") {
		t.Fatal("without a filter both servers must be reached")
	}

	f := &Filter{Device: "host0", Table: TableName("host0"), NetNS: host.path, Log: logrus.NewEntry(logrus.New())}
	check := func(allowed, denied string) {
		t.Helper()
		p, err := Parse(false, []string{allowed + "/32"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Set(p); err != nil {
			t.Fatal(err)
		}
		if !reached(allowed) {
			t.Errorf("policy %v: %s not reached", p, allowed)
		}
		if reached(denied) {
			t.Errorf("policy %v: %s reached", p, denied)
		}
		st, err := f.Status()
		if err != nil {
			t.Fatal(err)
		}
		var allowCount, dropCount uint64
		for _, c := range st.Counters {
			switch {
			case c.Action == ActionAllow && c.CIDR == allowed+"/32":
				allowCount = c.Packets
			case c.Action == ActionNoInternet && c.CIDR == "0.0.0.0/0":
				dropCount = c.Packets
			}
		}
		if !st.Policy.Equal(p) || allowCount == 0 || dropCount == 0 {
			t.Errorf("status %+v: want the policy, allowed and dropped packets counted", st)
		}
	}
	check("10.99.0.1", "10.99.0.2")
	check("10.99.0.2", "10.99.0.1") // changed while "running": replaced in one transaction

	tableGone := func() bool {
		c, done, err := f.conn()
		if err != nil {
			t.Fatal(err)
		}
		defer done()
		_, err = c.ListTableOfFamily(f.Table, nftables.TableFamilyNetdev)
		return errors.Is(err, unix.ENOENT)
	}
	if err := f.Remove(); err != nil || !tableGone() {
		t.Errorf("Remove: %v; table gone: %v", err, tableGone())
	}
	if !reached("10.99.0.1") || !reached("10.99.0.2") {
		t.Error("after Remove both servers must be reached")
	}
	if err := f.Set(Policy{AllowInternet: true, DenyOut: mustPrefixes(t, "10.99.0.2")}); err != nil {
		t.Fatal(err)
	}
	if !reached("10.99.0.1") || reached("10.99.0.2") {
		t.Error("deny_out 10.99.0.2: want .1 reached, .2 not")
	}
	if err := f.Set(Open()); err != nil || !tableGone() {
		t.Errorf("open policy: %v; table gone: %v", err, tableGone())
	}
	if err := f.Remove(); err != nil {
		t.Errorf("second Remove: %v", err)
	}
}

func mustPrefixes(t *testing.T, s ...string) []netip.Prefix {
	p, err := Parse(true, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p.AllowOut
}
