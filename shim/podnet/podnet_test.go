package podnet

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/nftables"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/shim/egress"
)

func TestParseResolvConf(t *testing.T) {
	d := ParseResolvConf([]byte(`# CRI's
search default.svc.cluster.local svc.cluster.local # trailing comment
nameserver 10.96.0.10
nameserver not-an-ip
nameserver fe80::1%eth0
nameserver fd00::a
options ndots:5 edns0
options ndots:5
domain ignored-by-the-search-above
search svc.cluster.local cluster.local
`))
	if !slices.Equal(d.Nameservers, []string{"10.96.0.10", "fd00::a"}) || !slices.Equal(d.Search, []string{"svc.cluster.local", "cluster.local"}) ||
		!slices.Equal(d.Options, []string{"ndots:5", "edns0"}) {
		t.Errorf("parsed %+v", d)
	}
	var many bytes.Buffer
	for i := range 20 {
		fmt.Fprintf(&many, "nameserver 10.0.0.%d\n", i+1)
	}
	if d := ParseResolvConf(many.Bytes()); len(d.Nameservers) != maxNameservers {
		t.Errorf("%d nameservers kept, want the agent's bound %d", len(d.Nameservers), maxNameservers)
	}
}

func TestFromSpec(t *testing.T) {
	log := logrus.NewEntry(logrus.New())
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(resolv, []byte("nameserver 10.96.0.10\n"), 0o644)
	sandboxSpec := func(netns string) *specs.Spec {
		return &specs.Spec{
			Annotations: map[string]string{containerTypeAnnotation: containerTypeSandbox},
			Mounts:      []specs.Mount{{Destination: "/etc/resolv.conf", Source: resolv, Type: "bind"}},
			Linux:       &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace, Path: netns}}},
		}
	}
	n, err := FromSpec(sandboxSpec("/var/run/netns/cni-1"), log)
	if err != nil || n == nil || n.NetNS != "/var/run/netns/cni-1" || n.DNS == nil || n.DNS.Nameservers[0] != "10.96.0.10" {
		t.Fatalf("CRI sandbox: %+v %v", n, err)
	}
	// Host network (no path), no linux section, a container that is not a CRI sandbox: no network.
	hostNet := sandboxSpec("")
	notSandbox := sandboxSpec("/var/run/netns/x")
	delete(notSandbox.Annotations, containerTypeAnnotation)
	for name, s := range map[string]*specs.Spec{"host network": hostNet, "no linux": {}, "ctr --with-ns": notSandbox} {
		if n, err := FromSpec(s, log); n != nil || err != nil {
			t.Errorf("%s: %+v %v, want no network", name, n, err)
		}
	}
	big := sandboxSpec("/var/run/netns/cni-1")
	os.WriteFile(resolv, bytes.Repeat([]byte("#"), maxResolvConf+1), 0o644)
	if _, err := FromSpec(big, log); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("oversized resolv.conf: %v", err)
	}
}

// nsThread is a locked OS thread in a network namespace of its own: the
// namespace lives as long as the thread, which ends (never unlocked) at
// cleanup, so nothing stays on the host.
type nsThread struct {
	path string
	fns  chan func()
}

func newNSThread(t *testing.T) *nsThread {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, veths, taps and tc need CAP_SYS_ADMIN and CAP_NET_ADMIN (make test runs this as root)")
	}
	n := &nsThread{fns: make(chan func())}
	ready := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
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

// TestAttachRedirects is the tcfilter model end to end, without a VM: a
// pod namespace with a veth eth0 (10.99.0.5/24, default via 10.99.0.1) whose
// peer is in a "bridge" namespace. After Attach, a frame sent by the peer
// comes out of the tap fd the VMM would read, and a frame written to the tap
// fd reaches the peer; the guest description is the veth's. Detach removes
// the qdiscs, and closing the fd the tap.
// podVeth makes, as CNI's bridge plugin would, eth0 (10.99.0.5/24, MTU
// 1450, default via 10.99.0.1) in pod with its peer peer0 (up) in peer,
// and returns eth0's MAC and peer0's index.
func podVeth(t *testing.T, pod, peer *nsThread) (string, int) {
	t.Helper()
	var podMAC string
	pod.do(t, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", MTU: 1450}, PeerName: "peer0"}); err != nil {
			return err
		}
		l, _ := netlink.LinkByName("eth0")
		podMAC = l.Attrs().HardwareAddr.String()
		p, _ := netlink.LinkByName("peer0")
		fd, err := unix.Open(peer.path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := netlink.LinkSetNsFd(p, fd); err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 99, 0, 5), Mask: net.CIDRMask(24, 32)}}); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.IPv4(10, 99, 0, 1)})
	})
	var peerIdx int
	peer.do(t, func() error {
		p, err := netlink.LinkByName("peer0")
		if err != nil {
			return err
		}
		peerIdx = p.Attrs().Index
		return netlink.LinkSetUp(p)
	})

	return podMAC, peerIdx
}

func TestAttachRedirects(t *testing.T) {
	pod, peer := newNSThread(t), newNSThread(t)
	podMAC, peerIdx := podVeth(t, pod, peer)
	n := &Network{NetNS: pod.path, HostNetNS: peer.path, Log: logrus.NewEntry(logrus.New())}
	if err := n.SetEgressPolicy(context.Background(), egress.Open()); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("egress policy before Attach: %v, want FailedPrecondition", err)
	}
	att, err := n.Attach(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tap := att.NICs[0].Tap
	defer tap.Close()
	g := att.Guest.Interfaces[0]
	if g.Name != "eth0" || g.MAC != podMAC || att.NICs[0].MAC != podMAC || g.MTU != 1450 ||
		!slices.Equal(g.Addresses, []string{"10.99.0.5/24"}) || len(g.Routes) != 1 || g.Routes[0].Gateway != "10.99.0.1" || g.Routes[0].Destination != "" {
		t.Errorf("guest interface %+v (NIC mac %s), want the veth's (mac %s)", g, att.NICs[0].MAC, podMAC)
	}
	if _, err := n.Attach(context.Background()); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("second Attach: %v", err)
	}

	// Peer → eth0 ingress → redirected → out of the tap fd (after the 10-byte vnet header).
	frame := testFrame(podMAC, "peer→vm")
	peer.do(t, func() error { return sendRaw(peerIdx, frame) })
	if got, err := readTap(tap, "peer→vm"); err != nil {
		t.Errorf("frame from the peer did not come out of the tap: %v (last read %x)", err, got)
	}
	// Tap fd → tap ingress → redirected → out of eth0 → the peer.
	back := testFrame("ff:ff:ff:ff:ff:ff", "vm→peer")
	var got []byte
	peer.do(t, func() error {
		s, err := rawSocket(peerIdx)
		if err != nil {
			return err
		}
		defer unix.Close(s)
		if _, err := tap.Write(append(make([]byte, 10), back...)); err != nil {
			return err
		}
		got, err = recvUntil(s, "vm→peer")
		return err
	})
	if !bytes.Contains(got, []byte("vm→peer")) {
		t.Errorf("frame written to the tap did not reach the peer: %x", got)
	}
	checkEgress(t, n, tap, peer, peerIdx)

	if err := n.Detach(context.Background()); err != nil {
		t.Fatal(err)
	}
	tap.Close()
	pod.do(t, func() error {
		l, _ := netlink.LinkByName("eth0")
		qs, _ := netlink.QdiscList(l)
		for _, q := range qs {
			if q.Type() == "ingress" {
				return fmt.Errorf("ingress qdisc left on eth0 after Detach: %+v", q)
			}
		}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if _, err := netlink.LinkByName(TapName); err != nil {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("tap %s left after Detach and closing its fd", TapName)
			}
		}
	})
	if err := n.Detach(context.Background()); err != nil {
		t.Errorf("second Detach: %v", err)
	}
	peer.do(t, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		if _, err := c.ListTableOfFamily(egress.TableName("peer0"), nftables.TableFamilyNetdev); !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("egress table after Detach: %v, want none", err)
		}
		return nil
	})
}

// checkEgress: the VM's frames cross the host's end of the link (peer0,
// found as the veth's peer in the host namespace), where a policy without
// internet access drops a frame the VM writes to the tap (neither ARP nor
// IP: the non-ip rule) and counts it; an open policy lets it through again.
func checkEgress(t *testing.T, n *Network, tap *os.File, peer *nsThread, peerIdx int) {
	t.Helper()
	ctx := context.Background()
	if err := n.SetEgressPolicy(ctx, egress.Policy{}); err != nil {
		t.Fatal(err)
	}
	var err error
	peer.do(t, func() error {
		s, serr := rawSocket(peerIdx)
		if serr != nil {
			return serr
		}
		defer unix.Close(s)
		tv := unix.Timeval{Sec: 1}
		unix.SetsockoptTimeval(s, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		if _, werr := tap.Write(append(make([]byte, 10), testFrame("ff:ff:ff:ff:ff:ff", "vm→denied")...)); werr != nil {
			return werr
		}
		_, err = recvUntil(s, "vm→denied")
		return nil
	})
	if err == nil {
		t.Error("a frame the policy drops reached the peer")
	}
	st, serr := n.EgressStatus(ctx)
	if serr != nil {
		t.Fatal(serr)
	}
	dropped := uint64(0)
	for _, c := range st.Counters {
		if c.Action == egress.ActionNonIP {
			dropped = c.Packets
		}
	}
	if st.Device != "peer0" || dropped == 0 {
		t.Errorf("egress status %+v: want device peer0 and the dropped frame counted", st)
	}
	if err := n.SetEgressPolicy(ctx, egress.Open()); err != nil {
		t.Fatal(err)
	}
}

// TestAttachFailures: a namespace CNI did not configure, and one that does
// not exist, are refused, and leave no tap behind.
func TestAttachFailures(t *testing.T) {
	pod := newNSThread(t)
	n := &Network{NetNS: pod.path, Log: logrus.NewEntry(logrus.New())}
	if _, err := n.Attach(context.Background()); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("namespace without a CNI interface: %v, want FailedPrecondition", err)
	}
	pod.do(t, func() error {
		if _, err := netlink.LinkByName(TapName); err == nil {
			return fmt.Errorf("tap left after a failed Attach")
		}
		return nil
	})
	n = &Network{NetNS: "/nonexistent/netns", Log: logrus.NewEntry(logrus.New())}
	if _, err := n.Attach(context.Background()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing namespace: %v, want NotFound", err)
	}
	if err := n.Detach(context.Background()); err != nil {
		t.Errorf("Detach without Attach: %v", err)
	}
}

const testEtherType = 0x88b5 // IEEE local experimental

func testFrame(dst, payload string) []byte {
	d, _ := net.ParseMAC(dst)
	f := append([]byte{}, d...)
	f = append(f, 0x02, 0, 0, 0, 0, 0x42)
	f = binary.BigEndian.AppendUint16(f, testEtherType)
	f = append(f, payload...)
	for len(f) < 60 {
		f = append(f, 0)
	}
	return f
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func rawSocket(ifindex int) (int, error) {
	s, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(testEtherType)))
	if err != nil {
		return -1, err
	}
	if err := unix.Bind(s, &unix.SockaddrLinklayer{Protocol: htons(testEtherType), Ifindex: ifindex}); err != nil {
		unix.Close(s)
		return -1, err
	}
	tv := unix.Timeval{Sec: 5}
	unix.SetsockoptTimeval(s, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	return s, nil
}

func sendRaw(ifindex int, frame []byte) error {
	s, err := rawSocket(ifindex)
	if err != nil {
		return err
	}
	defer unix.Close(s)
	return unix.Sendto(s, frame, 0, &unix.SockaddrLinklayer{Ifindex: ifindex, Halen: 6})
}

func recvUntil(s int, marker string) ([]byte, error) {
	buf := make([]byte, 2048)
	for {
		n, _, err := unix.Recvfrom(s, buf, 0)
		if err != nil {
			return nil, err
		}
		if bytes.Contains(buf[:n], []byte(marker)) {
			return buf[:n], nil
		}
	}
}

// readTap reads frames from the tap fd until one carries marker (IPv6
// router solicitations and the like may come first).
func readTap(tap *os.File, marker string) ([]byte, error) {
	tap.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 65536)
	for {
		n, err := tap.Read(buf)
		if err != nil {
			return buf[:n], err
		}
		if bytes.Contains(buf[:n], []byte(marker)) {
			return buf[:n], nil
		}
	}
}

// TestAttachInitialPolicy: the annotations' policy is in force when Attach
// returns (before any SetEgressPolicy: the VM's first frame meets it); a
// policy that cannot be enforced (no veth peer in the host namespace)
// fails Attach and leaves no tap.
func TestAttachInitialPolicy(t *testing.T) {
	pod, peer := newNSThread(t), newNSThread(t)
	_, peerIdx := podVeth(t, pod, peer)
	initial, err := policyFromAnnotations(map[string]string{AnnotationAllowInternet: "false", AnnotationAllowOut: "10.99.0.1, 192.0.2.0/24"})
	if err != nil {
		t.Fatal(err)
	}

	// The host namespace given is the pod's own: peer0 is not there.
	n := &Network{NetNS: pod.path, HostNetNS: pod.path, Initial: initial, Log: logrus.NewEntry(logrus.New())}
	if _, err := n.Attach(context.Background()); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("a policy without a host end: %v, want FailedPrecondition", err)
	}
	pod.do(t, func() error {
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			var qs []netlink.Qdisc
			all, _ := netlink.QdiscList(l)
			for _, q := range all {
				if q.Type() == "ingress" {
					qs = append(qs, q)
				}
			}
			_, terr := netlink.LinkByName(TapName)
			if terr != nil && len(qs) == 0 {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("after a failed Attach: tap %v, qdiscs on eth0 %v", terr == nil, qs)
			}
		}
	})

	n = &Network{NetNS: pod.path, HostNetNS: peer.path, Initial: initial, Log: logrus.NewEntry(logrus.New())}
	att, err := n.Attach(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tap := att.NICs[0].Tap
	defer tap.Close()
	defer n.Detach(context.Background())
	st, err := n.EgressStatus(context.Background())
	if err != nil || !st.Policy.Equal(*initial) || st.Device != "peer0" || len(st.Counters) == 0 {
		t.Fatalf("status right after Attach: %+v %v, want the annotations' policy on peer0", st, err)
	}
	peer.do(t, func() error {
		s, err := rawSocket(peerIdx)
		if err != nil {
			return err
		}
		defer unix.Close(s)
		tv := unix.Timeval{Sec: 1}
		unix.SetsockoptTimeval(s, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		if _, err := tap.Write(append(make([]byte, 10), testFrame("ff:ff:ff:ff:ff:ff", "first-frame")...)); err != nil {
			return err
		}
		if _, err := recvUntil(s, "first-frame"); err == nil {
			return fmt.Errorf("the VM's first frame passed a policy that drops it")
		}
		return nil
	})
}

func TestPolicyFromAnnotations(t *testing.T) {
	if p, err := policyFromAnnotations(map[string]string{"other": "x"}); p != nil || err != nil {
		t.Errorf("no annotations: %v %v", p, err)
	}
	p, err := policyFromAnnotations(map[string]string{AnnotationDenyOut: "192.0.2.0/24,,198.51.100.7"})
	if err != nil || !p.AllowInternet || len(p.DenyOut) != 2 || p.DenyOut[1].String() != "198.51.100.7/32" {
		t.Errorf("deny-out: %v %v", p, err)
	}
	for _, a := range []map[string]string{
		{AnnotationAllowInternet: "no"},
		{AnnotationAllowOut: "10.0.0.0/8,10.0.0.0/40"},
	} {
		_, err := policyFromAnnotations(a)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "io.cube.network.") {
			t.Errorf("%v: %v, want an invalid-argument error naming the annotation", a, err)
		}
	}
	_, err = policyFromAnnotations(map[string]string{AnnotationAllowOut: "10.0.0.0/8,10.0.0.0/40"})
	if err == nil || !strings.Contains(err.Error(), "allow_out[1]") {
		t.Errorf("bad allow-out entry: %v, want it named", err)
	}
}
