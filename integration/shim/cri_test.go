package shim

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/cubetest"
	"github.com/cube-runtime/cube/shim/task"
)

// A host-network pod (no CNI needed) with the pod's pid namespace per
// container, as kubelet asks by default.
const criPodConfig = `{
  "metadata": {"name": "cube-pod", "namespace": "default", "uid": "cube-pod-uid", "attempt": 0},
  "log_directory": "%s",
  "linux": {"security_context": {"namespace_options": {"network": 2, "pid": 1}}}
}`

// Each container writes its own name into its rootfs, then sleeps: an exec
// that reads it back proves it ran in that container.
const criContainerConfig = `{
  "metadata": {"name": "%[1]s"},
  "image": {"image": "%[2]s"},
  "command": ["/bin/sh", "-c", "echo %[1]s > /tmp/me; exec sleep 100000"],
  "log_path": "%[1]s.log",
  "linux": {"security_context": {"namespace_options": {"network": 2, "pid": 1}}}
}`

// criEnv is cubetest's CRI containerd, with this package's helpers as methods.
type criEnv struct{ *cubetest.CRI }

func (c *criEnv) run(bin string, args ...string) (string, error) { return c.Run(bin, args...) }
func (c *criEnv) crictl(args ...string) (string, error)          { return c.Crictl(args...) }
func (c *criEnv) ctr(args ...string) (string, error)             { return c.Ctr(args...) }

// cubeVMMs lists the pids of running cube-vmm processes.
func cubeVMMs() []int { return cubetest.ProcsNamed("cube-vmm") }

// startCRI starts containerd with its CRI plugin (cubetest.StartCRI).
func startCRI(t *testing.T) *criEnv { return &criEnv{cubetest.StartCRI(t, cubetest.CRIOptions{})} }

// checkPodLoopback: container b of a pod reaches an HTTP server in container a on 127.0.0.1, and sees lo up
// (operstate "unknown": lo reports no carrier). The pod is host-network, so both share the guest's initial
// network namespace, whose lo the agent brings up at boot; with lo down, the server would listen but b's wget
// would get "Network is unreachable".
func checkPodLoopback(t *testing.T, c *criEnv, a, b string) {
	t.Helper()
	// busybox httpd backgrounds itself (stdio on /dev/null), so the exec returns while it keeps serving in a.
	if _, err := c.crictl("exec", "-s", a, "sh", "-c",
		"busybox mkdir -p /tmp/www && echo hello-from-a > /tmp/www/hi && busybox httpd -p 127.0.0.1:8080 -h /tmp/www"); err != nil {
		t.Errorf("start an HTTP server on 127.0.0.1 in container a: %v", err)
		return
	}
	const want = "unknown\nhello-from-a"
	var got string
	var err error
	for deadline := time.Now().Add(20 * time.Second); ; {
		got, err = c.crictl("exec", "-s", b, "sh", "-c", "cat /sys/class/net/lo/operstate; busybox wget -q -O - http://127.0.0.1:8080/hi 2>&1")
		if err == nil && strings.TrimSpace(got) == want || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if err != nil || strings.TrimSpace(got) != want {
		t.Errorf("container b fetching http://127.0.0.1:8080/hi from container a: %q %v, want %q (lo up, the server answers)", got, err, want)
	} else {
		t.Log("pod loopback: container b reached container a's server on 127.0.0.1; lo is up")
	}
}

// TestCRIPodTwoContainersOneVM is the Kubernetes path: `crictl runp` with
// the contrib config's `cube` runtime handler (a pod with its own CNI network
// — bridge + host-local — when the plugins are in the test host: see
// checkPodNetwork; else host-network), then two containers created
// and started in the pod. All three (pause and two app containers) share
// one VM; each app container's rootfs is a drive slot re-pointed at its
// image (cube-vmm disk-set); `crictl exec` (streaming and sync) reaches each
// container; c2 reaches a server in c1 on 127.0.0.1 (checkPodLoopback); a
// second pod (its own VM) and this one reach each other by pod IP
// (checkPodToPod); stopping and removing the pods leaves nothing behind.
func TestCRIPodTwoContainersOneVM(t *testing.T) {
	c := startCRI(t)
	sockets := func() []string {
		ents, _ := os.ReadDir(filepath.Join(c.Dir, "s"))
		var n []string
		for _, e := range ents {
			n = append(n, e.Name())
		}
		return n
	}
	socketsBefore := sockets()
	shimsBefore := cubetest.ProcsNamed("containerd-shim-cube-v1")
	if pids := cubeVMMs(); len(pids) != 0 {
		t.Fatalf("cube-vmm already running before the pod: %v", pids)
	}

	// With the CNI plugins the pod has its own network (the VM's NIC, tc-redirected to CNI's veth),
	// else it is host-network.
	netMode := func(config string) string {
		if c.PodNet {
			return withPodNetwork(config)
		}
		return config
	}
	podJSON := filepath.Join(c.Dir, "pod.json")
	os.WriteFile(podJSON, fmt.Appendf(nil, netMode(criPodConfig), filepath.Join(c.Dir, "podlogs")), 0o644)
	start := time.Now()
	out, err := c.crictl("runp", "--runtime", "cube", podJSON)
	if err != nil {
		t.Fatal(err)
	}
	pod := strings.TrimSpace(out)
	t.Logf("crictl runp (pause container, VM cold boot) took %v (informational)", time.Since(start))
	podRemoved := false
	t.Cleanup(func() {
		if !podRemoved {
			c.crictl("stopp", pod)
			c.crictl("rmp", "-f", pod)
		}
	})

	createStart := func(name string) string {
		t.Helper()
		cj := filepath.Join(c.Dir, name+".json")
		os.WriteFile(cj, fmt.Appendf(nil, netMode(criContainerConfig), name, cubetest.ImageRef), 0o644)
		start := time.Now()
		out, err := c.crictl("create", pod, cj, podJSON)
		if err != nil {
			t.Fatal(err)
		}
		id := strings.TrimSpace(out)
		if _, err := c.crictl("start", id); err != nil {
			t.Fatal(err)
		}
		t.Logf("crictl create + start %s (disk-set, mount, container) took %v (informational)", name, time.Since(start))
		return id
	}
	// checkExec runs streaming and sync execs in container name and
	// returns the guest device its rootfs is on.
	checkExec := func(name, id string) string {
		t.Helper()
		// Streaming exec (the stream server, as kubectl exec uses), then ExecSync.
		var got string
		var err error
		for deadline := time.Now().Add(30 * time.Second); ; {
			got, err = c.crictl("exec", id, "cat", "/tmp/me")
			if err == nil && strings.TrimSpace(got) == name || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Second) // the container may not have written /tmp/me yet
		}
		if err != nil || strings.TrimSpace(got) != name {
			t.Errorf("crictl exec in %s: %q %v, want %q", name, got, err, name)
		}
		got, err = c.crictl("exec", "-s", id, "sh", "-c", "cat /etc/motd; echo exec-in-$(cat /tmp/me)")
		if err != nil || !strings.Contains(got, "from the image layer") || !strings.Contains(got, "exec-in-"+name) {
			t.Errorf("crictl exec -s in %s: %q %v", name, got, err)
		}
		// A non-zero exit comes back as such.
		if _, err := c.crictl("exec", "-s", id, "sh", "-c", "exit 3"); err == nil {
			t.Errorf("crictl exec -s in %s: exit 3 reported as success", name)
		}
		mounts, err := c.crictl("exec", "-s", id, "cat", "/proc/mounts")
		for _, l := range strings.Split(mounts, "\n") {
			if f := strings.Fields(l); len(f) > 2 && f[1] == "/" {
				// MountDisk's readahead (guest-agent/agent/diskreadahead.go).
				ra, err := c.crictl("exec", "-s", id, "cat", "/sys/block/"+filepath.Base(f[0])+"/queue/read_ahead_kb")
				if err != nil || strings.TrimSpace(ra) != "2048" {
					t.Errorf("readahead of %s's rootfs disk %s: %q %v, want 2048", name, f[0], ra, err)
				}
				return f[0]
			}
		}
		t.Errorf("no rootfs in the /proc/mounts of %s (%v):\n%s", name, err, mounts)
		return ""
	}

	ids := map[string]string{"c1": createStart("c1"), "c2": createStart("c2")}

	// One VM for the whole pod.
	pids := cubeVMMs()
	if len(pids) != 1 {
		t.Fatalf("%d cube-vmm processes for one pod (%v), want 1", len(pids), pids)
	}
	// …and it is this pod's: its command line names the pod's sandbox dir.
	sbDir := task.SandboxDir(filepath.Join(c.Dir, "vms"), "k8s.io", pod)
	if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pids[0])); !bytes.Contains(b, []byte(sbDir)) {
		t.Errorf("cube-vmm %d is not the pod's VM (command line %q lacks %s)", pids[0], bytes.ReplaceAll(b, []byte{0}, []byte{' '}), sbDir)
	}
	if vms, _ := os.ReadDir(filepath.Join(c.Dir, "vms")); len(vms) != 1 {
		t.Errorf("sandbox state dirs %v, want only the pod's", vms)
	}

	devs := map[string]string{}
	for name, id := range ids {
		devs[name] = checkExec(name, id)
	}
	// Each app container has its own drive slot, not the pause container's (vda).
	if devs["c1"] == devs["c2"] || devs["c1"] == "/dev/vda" || devs["c2"] == "/dev/vda" {
		t.Errorf("rootfs devices %v: want two distinct slots besides vda", devs)
	}
	checkPodLoopback(t, c, ids["c1"], ids["c2"])
	if c.PodNet {
		checkPodNetwork(t, c, pod, ids["c1"], ids["c2"])
		checkPodToPod(t, c, pod, ids["c1"], ids["c2"])
	}
	// A removed container's slot goes back to its stub and is taken by the
	// next one: same device, another image (a stale cached block of c1's
	// image would show here as c1's /tmp/me).
	if _, err := c.crictl("stop", "--timeout", "0", ids["c1"]); err != nil {
		t.Fatal(err)
	}
	if _, err := c.crictl("rm", ids["c1"]); err != nil {
		t.Fatal(err)
	}
	c3 := createStart("c3")
	if d := checkExec("c3", c3); d != devs["c1"] {
		t.Errorf("c3's rootfs is on %s, want c1's freed slot %s", d, devs["c1"])
	}
	if len(cubeVMMs()) != 1 {
		t.Errorf("cube-vmm processes after exec: %v", cubeVMMs())
	}

	if _, err := c.crictl("stopp", pod); err != nil {
		t.Fatal(err)
	}
	if _, err := c.crictl("rmp", pod); err != nil {
		t.Fatal(err)
	}
	podRemoved = true
	// The VM, its state dir (sockets, stubs, console), and the shim's socket go.
	var left []string
	for deadline := time.Now().Add(60 * time.Second); ; {
		left = nil
		if p := cubeVMMs(); len(p) > 0 {
			left = append(left, fmt.Sprintf("cube-vmm %v", p))
		}
		if ents, _ := os.ReadDir(filepath.Join(c.Dir, "vms")); len(ents) > 0 {
			left = append(left, fmt.Sprintf("sandbox state %v", ents))
		}
		if now := cubetest.ProcsNamed("containerd-shim-cube-v1"); len(now) > len(shimsBefore) {
			left = append(left, fmt.Sprintf("shim processes %v (before the pod: %v)", now, shimsBefore))
		}
		if now := sockets(); len(now) > len(socketsBefore) {
			left = append(left, fmt.Sprintf("shim sockets %v (before the pod: %v)", now, socketsBefore))
		}
		if c.PodNet {
			left = append(left, podNetworkLeftovers()...)
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if len(left) > 0 {
		t.Errorf("left after stopp + rmp: %s", strings.Join(left, "; "))
	}
	if out, err := c.crictl("pods", "-q"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("pods after rmp: %q %v", out, err)
	}
	if b, _ := os.ReadFile(filepath.Join(c.Dir, "containerd.log")); bytes.Contains(b, []byte("unknown op")) {
		t.Error("containerd log shows a VMM refusing an op")
	}
}
