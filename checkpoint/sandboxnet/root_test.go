package sandboxnet

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestDefaultNetworkRoot runs the default network list for real with
// Debian's CNI plugins (root tier, on the machine): ADD in a fresh network
// namespace gives an address of the default subnet on eth0, the NAT and
// exposed-port rules; Address reads it back from CNI's cache; DEL removes
// the rules and releases the address.
func TestDefaultNetworkRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, bridges, iptables): `make test-full` as root runs it")
	}
	for _, p := range []string{"bridge", "host-local", "portmap"} {
		if _, err := os.Stat(filepath.Join("/usr/lib/cni", p)); err != nil {
			t.Fatalf("CNI plugin %s: %v (install Debian's containernetworking-plugins)", p, err)
		}
	}
	if _, err := os.Stat("/sys/class/net/" + DefaultBridge); err == nil {
		t.Fatalf("bridge %s exists already: this test would change a network in use", DefaultBridge)
	}
	t.Cleanup(func() { exec.Command("ip", "link", "del", DefaultBridge).Run() })
	// portmap leaves its shared chains behind (for the next container): the
	// test removes them when it made them.
	if b, _ := exec.Command("iptables", "-t", "nat", "-S").CombinedOutput(); !strings.Contains(string(b), "CNI-HOSTPORT-DNAT") {
		t.Cleanup(removePortmapChains)
	}
	dir := t.TempDir()
	c := Config{Network: DefaultNetwork, ConfDir: filepath.Join(dir, "conf"), BinDirs: []string{"/usr/lib/cni"}, CacheDir: filepath.Join(dir, "cache")}
	if err := EnsureConflist(c); err != nil {
		t.Fatal(err)
	}
	if err := Check(c); err != nil {
		t.Fatal(err)
	}
	holder := exec.Command("unshare", "-n", "sleep", "600")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { holder.Process.Kill(); holder.Wait() }()
	// unshare execs sleep once the namespace exists.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		self, _ := os.Readlink("/proc/self/ns/net")
		its, _ := os.Readlink(netnsOf(holder.Process.Pid))
		if its != "" && its != self {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the namespace holder never got its own network namespace")
		}
	}
	const id = "sandboxnet-root-test"
	st := specs.State{ID: id, Pid: holder.Process.Pid, Annotations: map[string]string{AnnotationPorts: "18089:8080"}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := Add(ctx, c, st)
	if err != nil {
		t.Fatal(err)
	}
	deleted := false
	defer func() {
		if !deleted {
			Del(context.Background(), c, st)
		}
	}()
	if len(res.IPs) == 0 || !strings.HasPrefix(res.IPs[0].Address.String(), "10.98.") {
		t.Fatalf("CNI result: %+v", res)
	}
	ip, err := Address(c, id)
	if err != nil || !res.IPs[0].Address.IP.Equal(ip) {
		t.Fatalf("Address: %v %v, CNI gave %s", ip, err, res.IPs[0].Address)
	}
	out, err := exec.Command("nsenter", "-t", strconv.Itoa(holder.Process.Pid), "-n", "ip", "-4", "addr", "show", "dev", IfName).CombinedOutput()
	if err != nil || !strings.Contains(string(out), ip.String()+"/16") {
		t.Errorf("eth0 in the namespace: %v\n%s", err, out)
	}
	nat := func() string {
		b, _ := exec.Command("iptables", "-t", "nat", "-S").CombinedOutput()
		return string(b)
	}
	if n := nat(); !strings.Contains(n, "--dport 18089") || !strings.Contains(n, ip.String()) {
		t.Errorf("after ADD, no port mapping or masquerade for %s:\n%s", ip, n)
	}
	if err := Del(ctx, c, st); err != nil {
		t.Fatal(err)
	}
	deleted = true
	if n := nat(); strings.Contains(n, "--dport 18089") || strings.Contains(n, ip.String()) {
		t.Errorf("after DEL, rules of %s remain:\n%s", ip, n)
	}
	if _, err := Address(c, id); err == nil {
		t.Error("an address is still cached after DEL")
	}
	leases, _ := filepath.Glob(filepath.Join(c.CacheDir, "ipam", DefaultNetwork, "10.98.*"))
	if len(leases) != 0 {
		t.Errorf("host-local leases left: %v", leases)
	}
	// DEL again (a poststop hook run twice) is fine.
	if err := Del(ctx, c, st); err != nil {
		t.Errorf("second DEL: %v", err)
	}
}

func netnsOf(pid int) string { return "/proc/" + strconv.Itoa(pid) + "/ns/net" }

// removePortmapChains undoes what portmap's first ADD set up in the nat table.
func removePortmapChains() {
	ipt := func(args ...string) { exec.Command("iptables", append([]string{"-t", "nat"}, args...)...).Run() }
	ipt("-D", "PREROUTING", "-m", "addrtype", "--dst-type", "LOCAL", "-j", "CNI-HOSTPORT-DNAT")
	ipt("-D", "OUTPUT", "-m", "addrtype", "--dst-type", "LOCAL", "-j", "CNI-HOSTPORT-DNAT")
	ipt("-D", "POSTROUTING", "-m", "comment", "--comment", "CNI portfwd requiring masquerade", "-j", "CNI-HOSTPORT-MASQ")
	for _, c := range []string{"CNI-HOSTPORT-DNAT", "CNI-HOSTPORT-MASQ", "CNI-HOSTPORT-SETMARK"} {
		ipt("-F", c)
		ipt("-X", c)
	}
}
