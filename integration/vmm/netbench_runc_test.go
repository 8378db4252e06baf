package vmm

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/integration/netbench"
)

// The runc peer's veth: the host end and the container's, 10.0.5.0/24.
const (
	vethHost      = "nbveth0"
	vethContainer = "nbveth1"
)

// startRuncPeer runs netbench as a runc container (its own network, pid, mount, ipc and uts namespaces, a
// read-only rootfs holding only netbench) whose network namespace gets one end of a veth pair, as CNI's
// bridge plugin would give it (without the bridge): 10.0.5.2/24 inside, 10.0.5.1/24 on the test host.
//
// Ordering: `runc create` makes the namespaces and leaves the process waiting before exec; the veth end is
// moved into its network namespace and configured; then `runc start` runs netbench, whose listener needs no
// address yet, but its first client does.
func startRuncPeer(b *testing.B) (*netServer, error) {
	bundle := b.TempDir()
	root := filepath.Join(bundle, "rootfs")
	for _, d := range []string{"proc", "dev"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return nil, err
		}
	}
	bin, err := os.ReadFile(netbenchBin)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(root, "netbench"), bin, 0o755); err != nil {
		return nil, err
	}
	spec := &specs.Spec{
		Version:  specs.Version,
		Root:     &specs.Root{Path: "rootfs", Readonly: true},
		Hostname: "netbench",
		Process: &specs.Process{Args: []string{"/netbench"}, Cwd: "/", Env: []string{"PATH=/"},
			NoNewPrivileges: true},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "mode=755", "size=64k"}},
		},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
			{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.MountNamespace},
			{Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}}},
	}
	js, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), js, 0o644); err != nil {
		return nil, err
	}
	state := filepath.Join(bundle, "runc-state")
	id := fmt.Sprintf("netbench-%d-%d", os.Getpid(), time.Now().UnixNano()%1e6)
	runc := func(args ...string) error {
		out, err := exec.Command("runc", append([]string{"--root", state}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("runc %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	// The container's stdout and stderr: a file, so nothing here waits on a pipe the container holds.
	logf, err := os.Create(filepath.Join(bundle, "netbench.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	create := exec.Command("runc", "--root", state, "create", "--bundle", bundle, "--pid-file", filepath.Join(bundle, "pid"), id)
	create.Stdout, create.Stderr = logf, logf
	if err := create.Run(); err != nil {
		log, _ := os.ReadFile(logf.Name())
		return nil, fmt.Errorf("runc create: %v: %s", err, log)
	}
	b.Cleanup(func() { runc("delete", "--force", id) })
	pidb, err := os.ReadFile(filepath.Join(bundle, "pid"))
	if err != nil {
		return nil, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(pidb)))
	if err != nil {
		return nil, fmt.Errorf("runc pid file %q: %v", pidb, err)
	}
	if err := vethInto(b, pid); err != nil {
		return nil, err
	}
	if err := runc("start", id); err != nil {
		return nil, err
	}
	logText := func() string { l, _ := os.ReadFile(logf.Name()); return string(l) }
	return &netServer{
		client: netbench.Client{Addr: net.JoinHostPort("10.0.5.2", strconv.Itoa(netbench.Port)), Timeout: 2 * time.Minute},
		ended:  func() error { return nil }, // a container is never a lost nested VM: every failure is real
		finish: func() error {
			deadline := time.Now().Add(30 * time.Second)
			for {
				out, _ := exec.Command("runc", "--root", state, "state", id).Output()
				var st specs.State
				if json.Unmarshal(out, &st) == nil && st.Status == specs.StateStopped {
					return runc("delete", id)
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("runc container %s still %q 30 s after QUIT; its log:\n%s", id, st.Status, logText())
				}
				time.Sleep(100 * time.Millisecond)
			}
		},
		info: func() string {
			return "runc-veth: netbench in a runc container, veth " + vethHost + " ↔ " + vethContainer
		},
		kill: func() { runc("delete", "--force", id) },
	}, nil
}

// vethInto makes the veth pair, moves one end into the network namespace of pid and addresses both ends
// (lo up inside too). The host end is deleted when the benchmark ends (deleting either end deletes both).
func vethInto(b *testing.B, pid int) error {
	if l, err := netlink.LinkByName(vethHost); err == nil {
		netlink.LinkDel(l) // left by an earlier attempt whose container is gone
	}
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: vethHost}, PeerName: vethContainer}); err != nil {
		return fmt.Errorf("veth %s: %w (is the veth module loaded?)", vethHost, err)
	}
	b.Cleanup(func() {
		if l, err := netlink.LinkByName(vethHost); err == nil {
			netlink.LinkDel(l)
		}
	})
	host, err := netlink.LinkByName(vethHost)
	if err != nil {
		return fmt.Errorf("veth %s: %w", vethHost, err)
	}
	if err := netlink.AddrAdd(host, mustAddr("10.0.5.1/24")); err != nil {
		return fmt.Errorf("veth %s address: %w", vethHost, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("veth %s up: %w", vethHost, err)
	}
	peer, err := netlink.LinkByName(vethContainer)
	if err != nil {
		return fmt.Errorf("veth %s: %w", vethContainer, err)
	}
	if err := netlink.LinkSetNsPid(peer, pid); err != nil {
		return fmt.Errorf("veth %s into the container's netns: %w", vethContainer, err)
	}
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return fmt.Errorf("network namespace of the container's pid %d: %w", pid, err)
	}
	defer ns.Close()
	// Route netlink only: the test host's kernel has no xfrm_user (NETLINK_XFRM), which a handle of every
	// family would open.
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink in the container's network namespace: %w", err)
	}
	defer h.Close()
	inside, err := h.LinkByName(vethContainer)
	if err != nil {
		return fmt.Errorf("veth %s in the container: %w", vethContainer, err)
	}
	if err := h.AddrAdd(inside, mustAddr("10.0.5.2/24")); err != nil {
		return fmt.Errorf("veth %s address in the container: %w", vethContainer, err)
	}
	if err := h.LinkSetUp(inside); err != nil {
		return fmt.Errorf("veth %s up in the container: %w", vethContainer, err)
	}
	if lo, err := h.LinkByName("lo"); err == nil {
		h.LinkSetUp(lo)
	}
	return nil
}

func mustAddr(s string) *netlink.Addr {
	a, err := netlink.ParseAddr(s)
	if err != nil {
		panic(err)
	}
	return a
}

// printNetTable prints each peer's figures and the ratios of cube-vmm to the others: throughput as the median
// of the transfers (min–max), round trips as median and p99.
func printNetTable(peers []netPeer, figs map[string]netFigures, size int64, rtts int) {
	med := func(v []float64) float64 {
		if len(v) == 0 {
			return 0
		}
		s := slices.Clone(v)
		slices.Sort(s)
		return s[len(s)/2]
	}
	pct := func(d []time.Duration, p float64) time.Duration {
		if len(d) == 0 {
			return 0
		}
		s := slices.Clone(d)
		slices.Sort(s)
		return s[min(len(s)-1, int(float64(len(s))*p))]
	}
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	fmt.Printf("\nTCP test host ↔ server, %d MiB transfers each way (median MB/s, min–max), %d round trips of 64 bytes (µs)\n",
		size>>20, rtts)
	fmt.Printf("%-10s %-22s %-22s %10s %10s\n", "peer", "host→server MB/s", "server→host MB/s", "rtt p50", "rtt p99")
	for _, p := range peers {
		f, ok := figs[p.name]
		if !ok {
			fmt.Printf("%-10s (no figures)\n", p.name)
			continue
		}
		fmt.Printf("%-10s %-22s %-22s %10.0f %10.0f\n", p.name,
			fmt.Sprintf("%.0f (%.0f–%.0f)", med(f.in), slices.Min(f.in), slices.Max(f.in)),
			fmt.Sprintf("%.0f (%.0f–%.0f)", med(f.out), slices.Min(f.out), slices.Max(f.out)),
			us(pct(f.rtt, 0.5)), us(pct(f.rtt, 0.99)))
	}
	c, ok := figs["cube-vmm"]
	if ok {
		fmt.Printf("\nratios (throughput: >1 cube-vmm faster; rtt: <1 cube-vmm faster)\n")
		fmt.Printf("%-22s %12s %12s %10s %10s\n", "", "host→server", "server→host", "rtt p50", "rtt p99")
		for _, other := range []string{"qemu", "runc-veth"} {
			o, ok := figs[other]
			if !ok {
				continue
			}
			fmt.Printf("%-22s %11.2fx %11.2fx %9.2fx %9.2fx\n", "cube-vmm / "+other,
				med(c.in)/med(o.in), med(c.out)/med(o.out),
				float64(pct(c.rtt, 0.5))/float64(pct(o.rtt, 0.5)), float64(pct(c.rtt, 0.99))/float64(pct(o.rtt, 0.99)))
		}
	}
	for _, p := range peers {
		if f, ok := figs[p.name]; ok {
			fmt.Println(f.info)
		}
	}
}
