package net_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	vnet "github.com/cube-runtime/cube/hypervisor/virtio/net"
	"github.com/cube-runtime/cube/hypervisor/virtio/net/taptest"
	"github.com/cube-runtime/cube/hypervisor/virtio/virtiotest"
)

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// packetSocket is an AF_PACKET socket on the tap for one ethertype: what
// the device writes into the tap arrives there, what is sent on it comes
// out of the tap to the device.
func packetSocket(t *testing.T, name string, proto uint16) (int, int) {
	t.Helper()
	ifi, err := os.ReadFile(filepath.Join("/sys/class/net", name, "ifindex"))
	if err != nil {
		t.Fatal(err)
	}
	var idx int
	fmt.Sscan(strings.TrimSpace(string(ifi)), &idx)
	s, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(proto)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(s) })
	if err := unix.Bind(s, &unix.SockaddrLinklayer{Protocol: htons(proto), Ifindex: idx}); err != nil {
		t.Fatal(err)
	}
	return s, idx
}

// recvMatching reads frames from s until one has the marker, or fails.
func recvMatching(t *testing.T, s int, marker []byte) []byte {
	t.Helper()
	buf := make([]byte, 1<<17)
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		fds := []unix.PollFd{{Fd: int32(s), Events: unix.POLLIN}}
		if n, _ := unix.Poll(fds, 100); n <= 0 {
			continue
		}
		n, _, err := unix.Recvfrom(s, buf, unix.MSG_DONTWAIT)
		if err == nil && bytes.Contains(buf[:n], marker) {
			return bytes.Clone(buf[:n])
		}
	}
	t.Fatalf("no frame with %q on the tap", marker)
	return nil
}

// tcpFrame is an Ethernet/IPv4/TCP frame with n payload bytes, broadcast.
func tcpFrame(n int, marker string) []byte {
	f := make([]byte, 54+n)
	copy(f, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x54, 0, 0x12, 0x34, 0x56, 0x08, 0x00})
	ip := f[14:34]
	ip[0], ip[8], ip[9] = 0x45, 64, 6
	binary.BigEndian.PutUint16(ip[2:], uint16(20+20+n))
	copy(ip[12:], []byte{10, 99, 0, 2, 10, 99, 0, 1})
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	tcp := f[34:54]
	binary.BigEndian.PutUint16(tcp[0:], 40000)
	binary.BigEndian.PutUint16(tcp[2:], 5000)
	tcp[12], tcp[13] = 5<<4, 0x18 // PSH|ACK
	copy(f[54:], marker)
	return f
}

func TestTapRefusals(t *testing.T) {
	taptest.Need(t)
	name := taptest.Make(t, "cubet", 0)
	for _, c := range []struct{ name, want string }{
		{"cube-no-such0", "no such interface"},
		{"lo", "not a tun/tap"},
		{"a/b", "not an interface name"},
		{"", "not an interface name"},
		{"0123456789abcdef", "not an interface name"},
	} {
		if _, err := vnet.OpenTap(c.name); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("OpenTap(%q): %v, want %q", c.name, err, c.want)
		}
	}
	tap, err := vnet.OpenTap(name)
	if err != nil {
		t.Fatal(err)
	}
	defer tap.Close()
	if _, err := vnet.OpenTap(name); err == nil || !strings.Contains(err.Error(), "attached to another process") {
		t.Errorf("second OpenTap: %v", err)
	}
	// fd=: a tun fd that is a tap is taken; anything else is refused.
	f, _ := os.Open("/dev/null")
	defer f.Close()
	if err := vnet.CheckTapFD(int(f.Fd())); err == nil || !strings.Contains(err.Error(), "not an attached tap") {
		t.Errorf("CheckTapFD(/dev/null): %v", err)
	}
	if err := vnet.CheckTapFD(1); err == nil {
		t.Error("fd 1 accepted")
	}
}

// TestTapFromFD: a tap the caller attached without IFF_VNET_HDR runs
// without offloads.
func TestTapFromFD(t *testing.T) {
	taptest.Need(t)
	name := taptest.Make(t, "cubet", 0)
	fd := taptest.Attach(t, name, unix.IFF_TAP|unix.IFF_NO_PI)
	tap, err := vnet.TapFromFD(fd)
	if err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	defer tap.Close()
	if tap.VnetHdr() || tap.Offloads() != 0 || tap.Name() != name {
		t.Errorf("tap %q vnet %v offloads %#x", tap.Name(), tap.VnetHdr(), tap.Offloads())
	}
	dev, err := vnet.New(vnet.Options{MAC: testMAC, Backend: tap})
	if err != nil {
		t.Fatal(err)
	}
	d := virtiotest.NewDriver(t, dev, nil)
	if st := d.Init(allFeatures&^(vnet.FCsum|vnet.FGuestCsum|vnet.FHostTSO4|vnet.FHostTSO6|vnet.FHostECN|
		vnet.FGuestTSO4|vnet.FGuestTSO6|vnet.FGuestECN), 64); st != 0xF {
		t.Fatalf("status %#x", st)
	}
	g := &guest{t: t, d: d, dev: dev}
	s, _ := packetSocket(t, name, 0x88b5)
	f := frame(200, 0x33)
	copy(f[14:], "cube-fd-frame")
	g.txFrame(vnet.Header{}, f)
	if got := recvMatching(t, s, []byte("cube-fd-frame")); !bytes.Equal(got, f) {
		t.Errorf("host got %d bytes, want the frame without a header", len(got))
	}
	dev.Close()
}

// TestTapFrames drives a device over a real tap both ways, with the tap's
// offloads on: a plain frame each way and a 4 KiB TSO frame out.
func TestTapFrames(t *testing.T) {
	taptest.Need(t)
	name := taptest.Make(t, "cubet", 0)
	tap, err := vnet.OpenTap(name)
	if err != nil {
		t.Fatal(err)
	}
	const need = vnet.TunFCsum | vnet.TunFTSO4 | vnet.TunFTSO6
	if !tap.VnetHdr() || tap.Offloads()&need != need {
		t.Errorf("tap vnet %v offloads %#x, want at least %#x", tap.VnetHdr(), tap.Offloads(), need)
	}
	dev, err := vnet.New(vnet.Options{MAC: testMAC, Backend: tap})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	d := virtiotest.NewDriver(t, dev, nil)
	if st := d.Init(allFeatures, 64); st != 0xF { // TUNSETOFFLOAD with every flag
		t.Fatalf("status %#x", st)
	}
	g := &guest{t: t, d: d, dev: dev}
	custom, idx := packetSocket(t, name, 0x88b5)
	ipv4, _ := packetSocket(t, name, 0x0800)

	// Guest → host.
	f := frame(300, 0x11)
	copy(f[14:], "cube-tx-frame")
	g.txFrame(vnet.Header{}, f)
	if got := recvMatching(t, custom, []byte("cube-tx-frame")); !bytes.Equal(got, f) {
		t.Errorf("host got %d bytes, want the %d-byte frame", len(got), len(f))
	}
	// A TSO frame: the tap takes it whole (the host stack sees one 4 KiB skb).
	tso := tcpFrame(4000, "cube-tso-frame")
	g.txFrame(vnet.Header{Flags: vnet.HdrFNeedsCsum, GSOType: vnet.GSOTCPv4, HdrLen: 54, GSOSize: 1448, CsumStart: 34, CsumOffset: 16}, tso)
	if got := recvMatching(t, ipv4, []byte("cube-tso-frame")); len(got) != len(tso) {
		t.Errorf("host got a %d-byte frame, want %d", len(got), len(tso))
	}
	if s := dev.Stats(); s.TxErrors != 0 || s.TxFrames != 2 {
		t.Errorf("stats %+v", s)
	}

	// Host → guest.
	bufs := g.postRx(8, 2048)
	in := frame(500, 0x22)
	copy(in[14:], "cube-rx-frame")
	if err := unix.Sendto(custom, in, 0, &unix.SockaddrLinklayer{Protocol: htons(0x88b5), Ifindex: idx}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(wait)
	for {
		var found bool
		for _, u := range d.PopUsed(vnet.RxQueue) {
			got := d.Mem.Bytes(bufs[u.ID], int(u.Len))
			if bytes.Contains(got, []byte("cube-rx-frame")) {
				found = true
				if !bytes.Equal(got[vnet.HeaderLen:], in) || g.header(bufs[u.ID]).NumBuffers != 1 {
					t.Errorf("guest got %d bytes %+v, want the frame", len(got), g.header(bufs[u.ID]))
				}
			}
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the frame sent on the tap never reached the guest; stats %+v", dev.Stats())
		}
		time.Sleep(time.Millisecond)
	}
}
