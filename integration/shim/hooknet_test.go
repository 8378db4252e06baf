package shim

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/google/nftables"

	"github.com/cube-runtime/cube/checkpoint/sandboxnet"
	"github.com/cube-runtime/cube/integration/cubetest"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The network a createRuntime hook makes, as nerdctl's hook makes it for
// `nerdctl run -p`: a CNI network list (Debian's bridge, then portmap with
// the portMappings capability) run through libcni by a hook binary that
// reads the ports from an annotation of the OCI state — here `cube internal
// oci-hook` and io.cube.network.ports (nerdctl's own hook and nerdctl/ports
// work the same way; nerdctl is not served by the module proxy, so it cannot
// be built here). A shell script in front of it logs the state the shim gave.
const (
	hookCNIName   = "cube-hook"
	hookCNIBridge = "cube-hook0"
	hookCNIConf   = `{"cniVersion": "1.0.0", "name": "` + hookCNIName + `", "plugins": [
  {"type": "bridge", "bridge": "` + hookCNIBridge + `", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.89.0.0/16", "gateway": "10.89.0.1"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "%s"}},
  {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}]}`
	// hookCNIScript is the hook: $1 is the phase (createRuntime or poststop); the OCI state on stdin names the
	// pid whose network namespace CNI configures and carries the annotations.
	hookCNIScript = `state=$(busybox cat)
pid=$(echo "$state" | busybox sed -n 's/.*"pid":\([0-9]*\).*/\1/p')
status=$(echo "$state" | busybox sed -n 's/.*"status":"\([a-z]*\)".*/\1/p')
echo "hook $1 status=$status pid=$pid" >> %[1]s/hook.log
echo "$state" | ` + cubetest.CubeBin + ` internal oci-hook --network ` + hookCNIName + ` --cni-conf-dir %[1]s \
	--cni-bin-dir ` + cubetest.CNIBinDir + ` --cni-cache-dir %[1]s/cache $1 >> %[1]s/hook.log 2>&1`
	// hookHostPort on the test host's addresses maps to the container's server (port 8080).
	hookHostPort = 18080
	// hookHostAddr is an address of the test host (on lo) outside the hook's network.
	hookHostAddr = "10.78.0.1"
)

// TestCtrHookNetwork is issue 16's ctr hook path (`nerdctl run -p`'s): an
// io.cube.v1 container whose spec carries a createRuntime hook (CNI ADD of
// bridge + portmap, run as nerdctl's `nerdctl internal oci-hook` runs it)
// and a poststop hook (CNI DEL), and an exposed-port annotation
// (io.cube.network.ports 18080:8080). The shim runs the hook on the host
// with the OCI state naming a network namespace it holds, connects what CNI
// made there to the VM, and the container's HTTP server answers the test
// host at the address CNI gave, and at host port 18080 of the test host's
// own addresses (another address on lo, and 127.0.0.1) through portmap's
// DNAT. Deleting the container runs the poststop hook: no bridge port, DNAT
// rule, cached result or address lease is left. `cube network policy`
// reaches the same network.
func TestCtrHookNetwork(t *testing.T) {
	d := startDaemons(t)
	for _, p := range []string{"bridge", "host-local", "portmap"} {
		if _, err := os.Stat(filepath.Join(cubetest.CNIBinDir, p)); err != nil {
			t.Fatalf("CNI plugin %s not in the test host (Debian's containernetworking-plugins: .ci/install.d/containerd.sh)", p)
		}
	}
	if _, err := os.Stat(cubetest.IptablesBin); err != nil {
		t.Fatalf("iptables not in the test host (CNI's portmap runs it): install Debian's iptables (a dependency of containernetworking-plugins): %v", err)
	}
	if out, err := exec.Command("/bin/busybox", "ip", "addr", "add", hookHostAddr+"/32", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("add %s to lo: %v: %s", hookHostAddr, err, out)
	}
	t.Cleanup(func() { exec.Command("/bin/busybox", "ip", "addr", "del", hookHostAddr+"/32", "dev", "lo").Run() })
	const id = "hooknet"
	dir := filepath.Join(d.Dir, "hook")
	os.MkdirAll(dir, 0o755)
	cni := sandboxnet.Config{Network: hookCNIName, ConfDir: dir, BinDirs: []string{cubetest.CNIBinDir}, CacheDir: filepath.Join(dir, "cache")}
	os.WriteFile(filepath.Join(dir, hookCNIName+".conflist"), fmt.Appendf(nil, hookCNIConf, filepath.Join(cni.CacheDir, "ipam")), 0o644)
	script := fmt.Sprintf(hookCNIScript, dir)
	hook := func(phase string) specs.Hook {
		return specs.Hook{Path: "/bin/busybox", Args: []string{"sh", "-c", script, "hook", phase}, Env: []string{"PATH=/bin:/usr/bin:/sbin:/usr/sbin"}}
	}
	withHooks := func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Hooks = &specs.Hooks{CreateRuntime: []specs.Hook{hook("createRuntime")}, Poststop: []specs.Hook{hook("poststop")}}
		return nil
	}
	hookLog := func() string { b, _ := os.ReadFile(filepath.Join(dir, "hook.log")); return string(b) }

	client, err := containerd.New(d.Dir + "/containerd.sock")
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), "e2e"), 10*time.Minute)
	defer cancel()
	img, err := client.GetImage(ctx, cubetest.ImageRef)
	if err != nil {
		t.Fatal(err)
	}
	ctr, err := client.NewContainer(ctx, id, containerd.WithImage(img), containerd.WithSnapshotter("cube"),
		containerd.WithNewSnapshot(id+"-rootfs", img), containerd.WithRuntime("io.cube.v1", nil),
		containerd.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs("sh", "-c",
			"busybox mkdir -p /tmp/www && echo hello-over-the-hook-network > /tmp/www/i && exec busybox httpd -f -p 0.0.0.0:8080 -h /tmp/www"),
			oci.WithAnnotations(map[string]string{sandboxnet.AnnotationPorts: fmt.Sprintf("%d:8080", hookHostPort)}),
			withHooks))
	if err != nil {
		t.Fatal(err)
	}
	deleted := false
	defer func() {
		if !deleted {
			ctr.Delete(context.WithoutCancel(ctx), containerd.WithSnapshotCleanup)
		}
	}()
	task, err := ctr.NewTask(ctx, cio.NullIO)
	if err != nil {
		t.Fatalf("create task: %v\nhook log:\n%s", err, hookLog())
	}
	taskDeleted := false
	defer func() {
		if !taskDeleted {
			task.Delete(context.WithoutCancel(ctx), containerd.WithProcessKill)
		}
	}()
	if err := task.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("hook log after create:\n%s", hookLog())
	if !regexp.MustCompile(`hook createRuntime status=creating pid=[0-9]+`).MatchString(hookLog()) {
		t.Fatalf("the createRuntime hook did not run with the OCI state (status creating, a pid):\n%s", hookLog())
	}
	addr, err := sandboxnet.Address(cni, id)
	if err != nil || !strings.HasPrefix(addr.String(), "10.89.") {
		t.Fatalf("the container's address from CNI's cache: %v %v\nhook log:\n%s", addr, err, hookLog())
	}
	ip := addr.String()

	// The test host reaches the container's server at the address CNI gave the hook's namespace…
	const want = "hello-over-the-hook-network"
	if body, err := hookGet(fmt.Sprintf("http://%s:8080/i", ip), want); err != nil {
		t.Errorf("GET from the test host at the container's address %s: %q %v", ip, body, err)
	} else {
		t.Logf("hook network: the test host reached the container's server at %s", ip)
	}
	// …and at the host port of its own addresses: portmap's DNAT (nerdctl run's -p).
	if rules := hostPortRules(t); len(rules) == 0 {
		t.Errorf("no DNAT chain in the nat table after CNI ADD with a port mapping (hook log:\n%s)", hookLog())
	}
	for _, h := range []string{hookHostAddr, "127.0.0.1"} {
		url := fmt.Sprintf("http://%s:%d/i", h, hookHostPort)
		if body, err := hookGet(url, want); err != nil {
			t.Errorf("GET %s (host port %d mapped to the container's 8080): %q %v", url, hookHostPort, body, err)
		} else {
			t.Logf("host port: %s reached the container's server", url)
		}
	}
	if out, rc := d.Cube(t, "network", "policy", id); rc != 0 || !strings.Contains(out, "internet   allowed") {
		t.Errorf("cube network policy on the hook network: rc %d\n%s", rc, out)
	}

	if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil {
		t.Fatal(err)
	}
	taskDeleted = true
	if err := ctr.Delete(ctx, containerd.WithSnapshotCleanup); err != nil {
		t.Fatal(err)
	}
	deleted = true
	if !regexp.MustCompile(`hook poststop status=stopped pid=[0-9]+`).MatchString(hookLog()) {
		t.Errorf("the poststop hook did not run (status stopped):\n%s", hookLog())
	}
	if ents, _ := os.ReadDir("/sys/class/net/" + hookCNIBridge + "/brif"); len(ents) > 0 {
		t.Errorf("bridge ports left on %s after the container was deleted: %v", hookCNIBridge, ents)
	}
	if rules := hostPortRules(t); len(rules) > 0 {
		t.Errorf("DNAT rules left after the container was deleted: %v", rules)
	}
	if _, err := sandboxnet.Address(cni, id); !errdefs.IsNotFound(err) {
		t.Errorf("CNI's cached result after the container was deleted: %v, want none", err)
	}
	if leases, _ := filepath.Glob(filepath.Join(cni.CacheDir, "ipam", hookCNIName, "10.89.*")); len(leases) > 0 {
		t.Errorf("address leases left: %v", leases)
	}
	if tabs := egressTables(t); len(tabs) != 0 {
		t.Errorf("egress tables left: %v", tabs)
	}
}

// hookGet GETs url until it answers want (the server may still be starting).
func hookGet(url, want string) (string, error) {
	client := &http.Client{Timeout: 10 * time.Second}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(time.Second) {
		var body []byte
		resp, err := client.Get(url)
		if err == nil {
			body, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		if err == nil && strings.TrimSpace(string(body)) == want {
			return string(body), nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("the answer is not %q", want)
			}
			return string(body), err
		}
	}
}

// hostPortRules lists what CNI's portmap keeps for mapped ports in the test
// host's nat table (iptables-nft: table ip nat): each container's CNI-DN-…
// chain of DNAT rules, and the rules of CNI-HOSTPORT-DNAT that jump to them
// (the shared chains themselves stay, empty, for the next container).
func hostPortRules(t *testing.T) []string {
	t.Helper()
	conn, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		t.Fatalf("list nftables chains: %v", err)
	}
	var out []string
	for _, ch := range chains {
		switch {
		case ch.Table.Name != "nat":
		case strings.HasPrefix(ch.Name, "CNI-DN-"):
			out = append(out, "chain "+ch.Name)
		case ch.Name == "CNI-HOSTPORT-DNAT":
			rules, err := conn.GetRules(ch.Table, ch)
			if err != nil {
				t.Fatalf("rules of %s: %v", ch.Name, err)
			}
			if len(rules) > 0 {
				out = append(out, fmt.Sprintf("%d rules in %s", len(rules), ch.Name))
			}
		}
	}
	return out
}
