package shim

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
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
	"github.com/cube-runtime/cube/integration/cubetest"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The network a createRuntime hook makes, as nerdctl's CNI hook would: the
// bridge plugin straight from a hook script (nerdctl is not served by the
// module proxy, so it cannot be built here).
const (
	hookCNIBridge = "cube-hook0"
	hookCNIConf   = `{"cniVersion": "1.0.0", "name": "cube-hook", "type": "bridge", "bridge": "` + hookCNIBridge + `",
  "isGateway": true, "ipMasq": false,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.89.0.0/16", "gateway": "10.89.0.1"}]], "routes": [{"dst": "0.0.0.0/0"}]}}`
	// hookCNIScript is the hook: $1 is ADD or DEL; the OCI state on stdin names the pid whose network
	// namespace CNI configures (as nerdctl's hook reads it).
	hookCNIScript = `state=$(busybox cat)
pid=$(echo "$state" | busybox sed -n 's/.*"pid":\([0-9]*\).*/\1/p')
status=$(echo "$state" | busybox sed -n 's/.*"status":"\([a-z]*\)".*/\1/p')
echo "hook $1 status=$status pid=$pid" >> %[1]s/hook.log
CNI_COMMAND=$1 CNI_CONTAINERID=%[2]s CNI_NETNS=/proc/$pid/ns/net CNI_IFNAME=eth0 CNI_PATH=` + cubetest.CNIBinDir + ` \
	` + cubetest.CNIBinDir + `/bridge < %[1]s/cni.json >> %[1]s/hook.log 2>&1`
)

// TestCtrHookNetwork is issue 16's ctr hook path: an io.cube.v1 container
// whose spec carries a createRuntime hook (CNI's bridge plugin, run by a
// script as nerdctl's `nerdctl internal oci-hook` runs it) and a poststop
// hook (CNI DEL). The shim runs the hook on the host with the OCI state
// naming a network namespace it holds, connects what CNI made there to the
// VM, and the container's HTTP server answers the test host at the address
// CNI gave; deleting the container runs the poststop hook and leaves no
// bridge port. `cube network policy` reaches the same network.
func TestCtrHookNetwork(t *testing.T) {
	d := startDaemons(t)
	for _, p := range []string{"bridge", "host-local"} {
		if _, err := os.Stat(filepath.Join(cubetest.CNIBinDir, p)); err != nil {
			t.Fatalf("CNI plugin %s not in the test host (Debian's containernetworking-plugins: .ci/install.d/containerd.sh)", p)
		}
	}
	const id = "hooknet"
	dir := filepath.Join(d.Dir, "hook")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "cni.json"), []byte(hookCNIConf), 0o644)
	script := fmt.Sprintf(hookCNIScript, dir, id)
	hook := func(cmd string) specs.Hook {
		return specs.Hook{Path: "/bin/busybox", Args: []string{"sh", "-c", script, "hook", cmd}, Env: []string{"PATH=/bin:/usr/bin:/sbin:/usr/sbin"}}
	}
	withHooks := func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Hooks = &specs.Hooks{CreateRuntime: []specs.Hook{hook("ADD")}, Poststop: []specs.Hook{hook("DEL")}}
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
	if !regexp.MustCompile(`hook ADD status=creating pid=[0-9]+`).MatchString(hookLog()) {
		t.Fatalf("the createRuntime hook did not run with the OCI state (status creating, a pid):\n%s", hookLog())
	}
	m := regexp.MustCompile(`"address":\s*"(10\.89\.[0-9.]+)/16"`).FindStringSubmatch(hookLog())
	if m == nil {
		t.Fatalf("no address in CNI's result:\n%s", hookLog())
	}
	ip := m[1]

	// The test host reaches the container's server at the address CNI gave the hook's namespace.
	url := fmt.Sprintf("http://%s:8080/i", ip)
	client2 := &http.Client{Timeout: 10 * time.Second}
	var body []byte
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(time.Second) {
		var resp *http.Response
		if resp, err = client2.Get(url); err == nil {
			body, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		if err == nil && strings.TrimSpace(string(body)) == "hello-over-the-hook-network" || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || strings.TrimSpace(string(body)) != "hello-over-the-hook-network" {
		t.Errorf("GET %s from the test host: %q %v", url, body, err)
	} else {
		t.Logf("hook network: the test host reached the container's server at %s", ip)
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
	if !regexp.MustCompile(`hook DEL status=stopped pid=[0-9]+`).MatchString(hookLog()) {
		t.Errorf("the poststop hook did not run (status stopped):\n%s", hookLog())
	}
	if ents, _ := os.ReadDir("/sys/class/net/" + hookCNIBridge + "/brif"); len(ents) > 0 {
		t.Errorf("bridge ports left on %s after the container was deleted: %v", hookCNIBridge, ents)
	}
	if tabs := egressTables(t); len(tabs) != 0 {
		t.Errorf("egress tables left: %v", tabs)
	}
}
