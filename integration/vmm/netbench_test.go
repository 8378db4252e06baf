package vmm

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/contrib/guestimage"
	"github.com/cube-runtime/cube/hypervisor/virtio/net/taptest"
	"github.com/cube-runtime/cube/integration/benchloss"
	"github.com/cube-runtime/cube/integration/netbench"
	"github.com/cube-runtime/cube/integration/sandboxenv"
	"github.com/cube-runtime/cube/integration/vmmrun"
)

// Paths inside the test host for the net benchmark.
const (
	netbenchInitrd = "/cube/guest/netbench.cpio.gz"
	netbenchBin    = "/cube/bin/netbench"
)

// The netbench guest's /init: load virtio-net, give eth0 the address cube.ip= names, serve the benchmark
// (netbench) until the host sends QUIT, power off.
const netbenchInit = `#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /tmp /usr/bin /usr/sbin /sbin
/bin/busybox mount -t devtmpfs dev /dev
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sys /sys
/bin/busybox --install -s
for m in $(cat /modules.order); do insmod "/lib/modules/$m" || echo "insmod $m failed"; done
ip=$(sed -n 's/.*cube\.ip=\([0-9./]*\).*/\1/p' /proc/cmdline)
ip link set lo up
ip link set eth0 up
ip addr add "$ip" dev eth0
echo "NET_FEATURES=$(cat /sys/class/net/eth0/device/features)"
/bin/netbench
echo "NETBENCH_EXIT=$?"
echo "NET_STATS=rx_errors $(cat /sys/class/net/eth0/statistics/rx_errors) rx_dropped $(cat /sys/class/net/eth0/statistics/rx_dropped) tx_errors $(cat /sys/class/net/eth0/statistics/tx_errors)"
poweroff -f
`

// prepareNetBench builds netbench (static) and the netbench guest's initramfs into dir and returns where
// they go in the test host.
func prepareNetBench(k *guestimage.Kernel, dir string) (map[string]string, error) {
	bin := filepath.Join(dir, "netbench")
	if err := sandboxenv.GoBuild(bin, "github.com/cube-runtime/cube/integration/netbench/netbench"); err != nil {
		return nil, err
	}
	r, err := modulesInitrd(k, netbenchInit, []string{"virtio_pci", "virtio_net"})
	if err != nil {
		return nil, err
	}
	if err := r.File("bin/netbench", bin); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := r.WriteTo(&buf, true); err != nil {
		return nil, err
	}
	initrd := filepath.Join(dir, "netbench.cpio.gz")
	if err := os.WriteFile(initrd, buf.Bytes(), 0o644); err != nil {
		return nil, err
	}
	return map[string]string{netbenchInitrd: initrd, netbenchBin: bin}, nil
}

// netServer is one running netbench server the benchmark drives.
type netServer struct {
	client netbench.Client
	// ended returns nil while the server's VM or container runs, else why it ended, classified (benchloss).
	ended func() error
	// finish waits for the end after QUIT and reports anything wrong seen there.
	finish func() error
	// info is a line of facts printed under the table (the guest's virtio-net features).
	info func() string
	// kill ends the VM or container at once (a sample that failed; a lost VM is retried with a fresh one).
	kill func()
}

// netPeer is one configuration compared: start brings up its server in a fresh VM or container.
type netPeer struct {
	name  string
	start func(b *testing.B) (*netServer, error)
}

// netbenchVM runs argv (cube-vmm or QEMU booting the netbench guest) with the guest at guestIP on a tap.
func netbenchVM(b *testing.B, argv []string, guestIP string, reset int) (*netServer, error) {
	r := vmmrun.Start(b, argv[0], argv[1:]...)
	name := filepath.Base(argv[0])
	ended := func() error {
		code, done := r.Exited()
		if !done {
			return nil
		}
		err := fmt.Errorf("%s exited %d while the benchmark ran; console:\n%s\nstderr:\n%s", name, code, r.ConsoleTail(), tail(r.Stderr(), 20))
		if r.Result("NETBENCH_EXIT") != "" {
			return err // the guest's server failed: ours, not the nested VM's loss
		}
		return benchloss.ExitedStatus(code, reset, err)
	}
	return &netServer{
		client: netbench.Client{Addr: net.JoinHostPort(guestIP, strconv.Itoa(netbench.Port)), Timeout: 2 * time.Minute},
		ended:  ended,
		finish: func() error {
			code, err := r.WaitErr(time.Minute)
			switch {
			case err != nil:
				return benchloss.Stalled(err)
			case r.Result("NETBENCH_EXIT") != "0":
				return fmt.Errorf("%s: guest netbench ended with %q (exit %d); console:\n%s", name, r.Result("NETBENCH_EXIT"), code, r.ConsoleTail())
			}
			return nil
		},
		info: func() string {
			return fmt.Sprintf("%s guest: virtio-net features %s; eth0 %s", name, r.Result("NET_FEATURES"), r.Result("NET_STATS"))
		},
		kill: func() { r.Kill(); r.WaitErr(10 * time.Second) },
	}, nil
}

// tapPeer makes a tap with the host side hostIP/24 for a VM peer.
func tapPeer(b *testing.B, prefix string, hostIP [4]byte) string {
	tap := taptest.Make(b, prefix, 0)
	if err := taptest.SetIPv4(tap, hostIP, [4]byte{255, 255, 255, 0}); err != nil {
		b.Fatal(err)
	}
	return tap
}

// netPeers makes the taps (kept across a peer's retries) and returns the peers in the order they run.
func netPeers(b *testing.B) []netPeer {
	cmdline := func(ip string) string { return guestCmdline + " cube.ip=" + ip + "/24" }
	cubeTap, qemuTap := tapPeer(b, "nbc", [4]byte{10, 0, 3, 1}), tapPeer(b, "nbq", [4]byte{10, 0, 4, 1})
	return []netPeer{
		{"cube-vmm", func(b *testing.B) (*netServer, error) {
			tap := cubeTap
			return netbenchVM(b, cubeVMMArgv("-kernel", guestKernel, "-initrd", netbenchInitrd, "-memory", "256",
				"-vcpus", "1", "-rng=false", "-cmdline", cmdline("10.0.3.2"),
				"-net", "tap="+tap+",mac=52:54:00:c0:be:31"), "10.0.3.2", benchloss.CubeVMMReset)
		}},
		{"qemu", func(b *testing.B) (*netServer, error) {
			tap := qemuTap
			// The same machine as the boot benchmark's qemu-pc; userspace virtio-net (no vhost-net, like
			// cube-vmm), the tap's offloads as QEMU negotiates them.
			return netbenchVM(b, []string{"qemu-system-x86_64", "-M", "pc", "-enable-kvm", "-cpu", "host",
				"-m", "256", "-smp", "1", "-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none",
				"-no-reboot", "-serial", "stdio", "-kernel", guestKernel, "-initrd", netbenchInitrd,
				"-append", cmdline("10.0.4.2"),
				"-netdev", "tap,id=n0,ifname=" + tap + ",script=no,downscript=no,vhost=off",
				"-device", "virtio-net-pci,netdev=n0,mac=52:54:00:c0:be:32,romfile="}, "10.0.4.2", benchloss.QEMUReset)
		}},
		{"runc-veth", startRuncPeer},
	}
}

// netFigures are one peer's measurements.
type netFigures struct {
	in, out []float64 // MB/s host→server and server→host, one per transfer
	rtt     []time.Duration
	info    string
}

// measure drives srv: a warm-up, then reps transfers of size bytes each way, then rtts round trips of 64
// bytes, then QUIT. An error is classified: the server's VM ended or stalled (lost, benchloss) or a real
// failure (a short or corrupt transfer, the server's own failure).
func measure(srv *netServer, size int64, reps, rtts int) (f netFigures, err error) {
	classify := func(err error) error {
		if e := srv.ended(); e != nil {
			return fmt.Errorf("%v (%w)", err, e)
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return benchloss.Stalled(err)
		}
		return err
	}
	if err := srv.client.WaitReady(3*time.Minute, srv.ended); err != nil {
		if _, lost := benchloss.IsLost(err); lost {
			return f, err
		}
		if srv.ended() == nil {
			return f, benchloss.Stalled(err)
		}
		return f, err
	}
	// Warm-up: TCP windows open, the guest's rx buffers are posted at their size.
	if _, err := srv.client.Sink(16 << 20); err != nil {
		return f, classify(err)
	}
	if _, err := srv.client.Source(16 << 20); err != nil {
		return f, classify(err)
	}
	if _, err := srv.client.Echo(64, 100); err != nil {
		return f, classify(err)
	}
	mbs := func(d time.Duration) float64 { return float64(size) / 1e6 / d.Seconds() }
	for range reps {
		d, err := srv.client.Sink(size)
		if err != nil {
			return f, classify(err)
		}
		f.in = append(f.in, mbs(d))
		if d, err = srv.client.Source(size); err != nil {
			return f, classify(err)
		}
		f.out = append(f.out, mbs(d))
	}
	if f.rtt, err = srv.client.Echo(64, rtts); err != nil {
		return f, classify(err)
	}
	if err := srv.client.Quit(); err != nil {
		return f, classify(err)
	}
	if err := srv.finish(); err != nil {
		return f, err
	}
	f.info = srv.info()
	return f, nil
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// BenchmarkNet measures TCP between the test host and a server behind each peer, one peer after the other in
// one run: cube-vmm's virtio-net on a tap, QEMU's virtio-net-pci on a tap (same kernel, initramfs, 256 MiB,
// 1 vCPU), and a runc container on a veth (the native baseline). Per peer: NET_BENCH_REPS (default 3)
// transfers of NET_BENCH_MIB MiB (default 64) each way, then NET_BENCH_RTTS (default 2000) round trips of a
// 64-byte request and its 64-byte answer on one connection. Every transferred byte is checked (a short or
// corrupt transfer fails the benchmark); the figures are only printed, as a table with ratios. Run once:
// -benchtime 1x. NET_BENCH_PEERS (e.g. "cube-vmm,qemu") runs only the peers it names.
func BenchmarkNet(b *testing.B) {
	size := int64(envInt("NET_BENCH_MIB", 64)) << 20
	reps, rtts := envInt("NET_BENCH_REPS", 3), envInt("NET_BENCH_RTTS", 2000)
	loss := benchloss.New(b)
	figs := map[string]netFigures{}
	peers := netPeers(b)
	if only := os.Getenv("NET_BENCH_PEERS"); only != "" {
		peers = slices.DeleteFunc(peers, func(p netPeer) bool { return !slices.Contains(strings.Split(only, ","), p.name) })
	}
	var failed error
	for _, p := range peers {
		start := time.Now()
		err := loss.Sample(p.name, func() error {
			srv, err := p.start(b)
			if err != nil {
				return err
			}
			f, err := measure(srv, size, reps, rtts)
			if err != nil {
				srv.kill()
				return err
			}
			figs[p.name] = f
			return nil
		})
		if err != nil {
			// Ordering: the table of the peers measured is printed before the benchmark fails.
			failed = fmt.Errorf("%s: %w", p.name, err)
			break
		}
		b.Logf("%s: done in %v", p.name, time.Since(start).Round(time.Millisecond))
	}
	printNetTable(peers, figs, size, rtts)
	if failed != nil && !errors.Is(failed, benchloss.ErrBound) {
		b.Fatal(failed)
	}
	loss.Check(b)
}
