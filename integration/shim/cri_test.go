package shim

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/cubetest"
	"github.com/cube-runtime/cube/shim/task"
)

// criContainerdConfig is containerd with the CRI plugin on and the contrib
// snippet imported; the pinned sandbox image is a local one (no registry).
const criContainerdConfig = `version = 3
root = "%[1]s/root"
state = "%[1]s/state"
temp = "%[1]s/tmp"
imports = ["%[2]s"]
disabled_plugins = [
  "io.containerd.nri.v1.nri",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
]

[grpc]
  address = "%[1]s/containerd.sock"
[ttrpc]
  address = "%[1]s/containerd.sock.ttrpc"

[plugins."io.containerd.shim.v1.manager"]
  socket_dir = "%[1]s/s"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "` + cubetest.PauseImageRef + `"

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["` + cubetest.CNIBinDir + `"]
  conf_dir = "%[1]s/net.d"
`

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

type criEnv struct {
	t   *testing.T
	dir string
	env []string
	// podNet: the CNI plugins are in the test host and containerd has their
	// config (criPodNetwork), so pods may have a network of their own.
	podNet bool
}

func (c *criEnv) run(bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = c.env
	cmd.WaitDelay = 10 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	c.t.Logf("%s %s:\n%s%s", filepath.Base(bin), strings.Join(args, " "), stdout.String(), stderr.String())
	if err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", filepath.Base(bin), strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

func (c *criEnv) crictl(args ...string) (string, error) {
	sock := "unix://" + c.dir + "/containerd.sock"
	// crictl's default timeout (2 s) is shorter than a VM boot in the test host.
	return c.run(cubetest.CrictlBin, append([]string{"--runtime-endpoint", sock, "--image-endpoint", sock, "--timeout", "300s"}, args...)...)
}

func (c *criEnv) ctr(args ...string) (string, error) {
	return c.run(cubetest.CtrBin, append([]string{"--address", c.dir + "/containerd.sock", "--namespace", "k8s.io"}, args...)...)
}

// cubeVMMs lists the pids of running cube-vmm processes.
func cubeVMMs() []int { return procsNamed("cube-vmm") }

// procsNamed lists the pids of processes whose argv[0] is named name.
func procsNamed(name string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		argv0, _, _ := bytes.Cut(b, []byte{0})
		if filepath.Base(string(argv0)) == name {
			pids = append(pids, pid)
		}
	}
	return pids
}

// startCRI starts cube-snapshotter on the contrib config's socket and
// containerd with its CRI plugin, and imports the e2e and pause images into
// the k8s.io namespace (unpacked into the cube snapshotter).
func startCRI(t *testing.T) *criEnv {
	for _, p := range []string{cubetest.ContainerdBin, cubetest.CtrBin, cubetest.CrictlBin} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("%s not in the test host: it was not found on the machine (.ci/install.d/containerd.sh installs containerd, ctr and crictl)", filepath.Base(p))
		}
	}
	if _, err := os.Stat(cubetest.CRIContribConfig); err != nil {
		t.Fatalf("contrib config not in the test host: %v", err)
	}
	dir, err := os.MkdirTemp("/tmp", "cri") // short: Unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c := &criEnv{t: t, dir: dir, env: append(os.Environ(), "PATH=/cube/bin:"+os.Getenv("PATH"))}
	cubetest.DumpConsolesOnFailure(t, dir, 60)

	// CRI copies the host's /etc/hosts and /etc/resolv.conf into each pod;
	// the test host's root has neither. The streaming server (crictl exec)
	// listens on 127.0.0.1.
	for name, content := range map[string]string{"/etc/hosts": "127.0.0.1 localhost\n", "/etc/resolv.conf": "nameserver 127.0.0.1\n"} {
		if _, err := os.Stat(name); err != nil {
			if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if out, err := exec.Command("/bin/busybox", "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("loopback up: %v: %s", err, out)
	}

	// Ordering: the CNI config is in place before containerd starts (its CRI loads it then).
	c.podNet = criPodNetwork(t, c)
	cubetest.WriteShimConfig(t, dir)
	if err := os.MkdirAll(filepath.Dir(cubetest.CRISnapshotterSock), 0o755); err != nil {
		t.Fatal(err)
	}
	cubetest.StartSnapshotter(t, dir, c.env, cubetest.CRISnapshotterSock)

	conf := filepath.Join(dir, "config.toml")
	os.WriteFile(conf, fmt.Appendf(nil, criContainerdConfig, dir, cubetest.CRIContribConfig), 0o600)
	cdLog, _ := os.Create(filepath.Join(dir, "containerd.log"))
	cd := exec.Command(cubetest.ContainerdBin, "--config", conf, "--log-level", "debug")
	cd.Env, cd.Stdout, cd.Stderr = c.env, cdLog, cdLog
	cd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cubetest.Stop(t, cd, filepath.Join(dir, "containerd.log")) })

	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := c.crictl("info"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("containerd's CRI did not come up")
		}
		time.Sleep(time.Second)
	}

	pause, err := cubetest.OCIImageTar("/bin/busybox", cubetest.PauseImageRef, []string{"sleep"}, "/bin/sleep", "2147483647")
	if err != nil {
		t.Fatal(err)
	}
	pauseTar := filepath.Join(dir, "pause.tar")
	if err := os.WriteFile(pauseTar, pause, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tar := range []string{cubetest.ImageTar, pauseTar} {
		if _, err := c.ctr("images", "import", "--snapshotter", "cube", tar); err != nil {
			t.Fatal(err)
		}
	}
	// CRI learns of imported images from events: wait until it lists both.
	for deadline := time.Now().Add(60 * time.Second); ; {
		out, err := c.crictl("images", "-q")
		if err == nil && strings.Count(out, "sha256:") >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CRI does not list the imported images: %v", err)
		}
		time.Sleep(time.Second)
	}
	return c
}

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
		ents, _ := os.ReadDir(filepath.Join(c.dir, "s"))
		var n []string
		for _, e := range ents {
			n = append(n, e.Name())
		}
		return n
	}
	socketsBefore := sockets()
	shimsBefore := procsNamed("containerd-shim-cube-v1")
	if pids := cubeVMMs(); len(pids) != 0 {
		t.Fatalf("cube-vmm already running before the pod: %v", pids)
	}

	// With the CNI plugins the pod has its own network (the VM's NIC, tc-redirected to CNI's veth),
	// else it is host-network.
	netMode := func(config string) string {
		if c.podNet {
			return withPodNetwork(config)
		}
		return config
	}
	podJSON := filepath.Join(c.dir, "pod.json")
	os.WriteFile(podJSON, fmt.Appendf(nil, netMode(criPodConfig), filepath.Join(c.dir, "podlogs")), 0o644)
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
		cj := filepath.Join(c.dir, name+".json")
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
	sbDir := task.SandboxDir(filepath.Join(c.dir, "vms"), "k8s.io", pod)
	if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pids[0])); !bytes.Contains(b, []byte(sbDir)) {
		t.Errorf("cube-vmm %d is not the pod's VM (command line %q lacks %s)", pids[0], bytes.ReplaceAll(b, []byte{0}, []byte{' '}), sbDir)
	}
	if vms, _ := os.ReadDir(filepath.Join(c.dir, "vms")); len(vms) != 1 {
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
	if c.podNet {
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
		if ents, _ := os.ReadDir(filepath.Join(c.dir, "vms")); len(ents) > 0 {
			left = append(left, fmt.Sprintf("sandbox state %v", ents))
		}
		if now := procsNamed("containerd-shim-cube-v1"); len(now) > len(shimsBefore) {
			left = append(left, fmt.Sprintf("shim processes %v (before the pod: %v)", now, shimsBefore))
		}
		if now := sockets(); len(now) > len(socketsBefore) {
			left = append(left, fmt.Sprintf("shim sockets %v (before the pod: %v)", now, socketsBefore))
		}
		if c.podNet {
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
	if b, _ := os.ReadFile(filepath.Join(c.dir, "containerd.log")); bytes.Contains(b, []byte("unknown op")) {
		t.Error("containerd log shows a VMM refusing an op")
	}
}
