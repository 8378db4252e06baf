package shim

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/checkpoint/store"
	"github.com/cube-runtime/cube/integration/cubetest"
	"github.com/cube-runtime/cube/shim/volume/volumetest"
)

// A container of the volume pod: CRI mounts of host directories laid out
// where and as the kubelet lays them out.
const criVolumeContainerConfig = `{
  "metadata": {"name": "%[1]s"},
  "image": {"image": "%[2]s"},
  "command": ["/bin/sh", "-c", %[3]q],
  "log_path": "%[1]s.log",
  "mounts": [
    {"container_path": "/cache", "host_path": "%[4]s"},
    {"container_path": "/etc/cfg", "host_path": "%[5]s", "readonly": true}
  ],
  "linux": {"security_context": {"namespace_options": {"network": 2, "pid": 1}}}
}`

// TestCRIPodVolumes: a pod with the `cube` handler whose two containers
// mount an emptyDir and a configMap as the kubelet renders them
// (/…/pods/<uid>/volumes/kubernetes.io~empty-dir/cache, and
// …~configmap/cfg with a timestamped dir, "..data" and per-key links).
// The writer's file in the emptyDir is read by the reader (the emptyDir is
// one directory in the VM, and the host's stays empty); the configMap is
// read-only in the guest with the kubelet's layout; the host's atomic swap
// of the configMap reaches the guest while the pod runs; a hostPath
// directory is shared through virtio-fs both ways (read-only refuses
// writes), a host socket is refused naming it, and removing the pod leaves
// the host directories' files in place. With the hostPath shared and a
// file of it held open, the pod's VM is snapshotted and rolled back in place
// (checkPodRollbackWithShares).
func TestCRIPodVolumes(t *testing.T) {
	c := startCRI(t)
	podDir := filepath.Join(c.Dir, "kubelet", "pods", "0c9e7a52-5b1d-4f0e-9d3c-2a7b6e8f1d40")
	cache := filepath.Join(podDir, "volumes", "kubernetes.io~empty-dir", "cache")
	cfg := filepath.Join(podDir, "volumes", "kubernetes.io~configmap", "cfg")
	for _, d := range []string{cache, cfg} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(cache, 0o777); err != nil { // as the kubelet makes an emptyDir
		t.Fatal(err)
	}
	if err := volumetest.WriteAtomic(cfg, map[string]string{"greeting": "hello-v1"}); err != nil {
		t.Fatal(err)
	}

	podJSON := filepath.Join(c.Dir, "volpod.json")
	os.WriteFile(podJSON, fmt.Appendf(nil, criPodConfig, filepath.Join(c.Dir, "podlogs")), 0o644)
	out, err := c.crictl("runp", "--runtime", "cube", podJSON)
	if err != nil {
		t.Fatal(err)
	}
	pod := strings.TrimSpace(out)
	t.Cleanup(func() {
		c.crictl("stopp", pod)
		c.crictl("rmp", "-f", pod)
	})
	createStart := func(name, script string) string {
		t.Helper()
		cj := filepath.Join(c.Dir, name+".json")
		os.WriteFile(cj, fmt.Appendf(nil, criVolumeContainerConfig, name, cubetest.ImageRef, script, cache, cfg), 0o644)
		out, err := c.crictl("create", pod, cj, podJSON)
		if err != nil {
			t.Fatal(err)
		}
		id := strings.TrimSpace(out)
		if _, err := c.crictl("start", id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	createStart("writer", "echo from-the-writer > /cache/shared; exec sleep 100000")
	reader := createStart("reader", "exec sleep 100000")
	cacheReader := reader

	// execUntil runs sh -c script in the reader until its output is want.
	execUntil := func(what, script, want string, limit time.Duration) bool {
		t.Helper()
		start := time.Now()
		var got string
		var err error
		for deadline := start.Add(limit); ; {
			got, err = c.crictl("exec", "-s", reader, "sh", "-c", script)
			if err == nil && strings.TrimSpace(got) == want {
				t.Logf("%s: seen after %v (informational)", what, time.Since(start).Round(100*time.Millisecond))
				return true
			}
			if time.Now().After(deadline) {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		t.Errorf("%s: %q %v, want %q", what, got, err, want)
		return false
	}

	// emptyDir: one directory in the VM for both containers; nothing on the host.
	execUntil("the writer's file in the shared emptyDir", "cat /cache/shared", "from-the-writer", time.Minute)
	if ents, err := os.ReadDir(cache); err != nil || len(ents) != 0 {
		t.Errorf("host emptyDir %s holds %v (%v): the emptyDir should live in the VM", cache, ents, err)
	}

	// configMap: the kubelet's layout, read-only.
	execUntil("the configMap key", "cat /etc/cfg/greeting", "hello-v1", time.Minute)
	ts, err := os.Readlink(filepath.Join(cfg, "..data"))
	if err != nil {
		t.Fatal(err)
	}
	execUntil("the configMap's links", "busybox readlink /etc/cfg/..data; busybox readlink /etc/cfg/greeting", ts+"\n..data/greeting", time.Minute)
	if out, err := c.crictl("exec", "-s", reader, "sh", "-c", "echo x > /etc/cfg/new"); err == nil {
		t.Errorf("writing into the read-only configMap succeeded: %q", out)
	}

	// The kubelet's atomic swap on the host reaches the guest.
	if err := volumetest.WriteAtomic(cfg, map[string]string{"greeting": "hello-v2", "added": "a-new-key"}); err != nil {
		t.Fatal(err)
	}
	execUntil("the configMap update in the guest", "echo $(cat /etc/cfg/greeting) $(cat /etc/cfg/added)", "hello-v2 a-new-key", time.Minute)

	// hostPath (virtio-fs): writes from the guest reach the host, the host's
	// reach the guest; a read-only one refuses writes.
	hostPath, hostRO := filepath.Join(c.Dir, "hostpath"), filepath.Join(c.Dir, "hostpath-ro")
	for _, d := range []string{hostPath, hostRO} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(hostRO, "fixed"), []byte("from-the-host-ro\n"), 0o644)
	os.WriteFile(filepath.Join(hostPath, "keep"), []byte("kept-open\n"), 0o644)
	hpConfig := strings.Replace(criVolumeContainerConfig, `"container_path": "/cache"`, `"container_path": "/hp"`, 1)
	hpConfig = strings.Replace(hpConfig, `"container_path": "/etc/cfg"`, `"container_path": "/hpro"`, 1)
	cj := filepath.Join(c.Dir, "hp.json")
	// The container holds /hp/keep open (fd 3, never read before the snapshot, so nothing of it is in the
	// guest's page cache) and, each time the host makes /hp/go, copies what fd 3 reads to /hp/held-read.
	hpScript := "echo from-the-guest > /hp/g; exec 3</hp/keep; " +
		"while true; do if [ -e /hp/go ]; then busybox rm /hp/go; cat <&3 > /hp/held-read; fi; sleep 1; done"
	os.WriteFile(cj, fmt.Appendf(nil, hpConfig, "hostpath", cubetest.ImageRef, hpScript, hostPath, hostRO), 0o644)
	// CRI makes the task (where the shim sees the spec) at start.
	out, err = c.crictl("create", pod, cj, podJSON)
	if err != nil {
		t.Fatal(err)
	}
	hp := strings.TrimSpace(out)
	if _, err := c.crictl("start", hp); err != nil {
		t.Fatal(err)
	}
	waitHostFile(t, filepath.Join(hostPath, "g"), "from-the-guest\n")
	os.WriteFile(filepath.Join(hostPath, "h"), []byte("from-the-host\n"), 0o644)
	reader = hp
	execUntil("a host file in the hostPath", "cat /hp/h /hpro/fixed", "from-the-host\nfrom-the-host-ro", time.Minute)
	if out, err := c.crictl("exec", "-s", hp, "sh", "-c", "echo x > /hpro/new"); err == nil {
		t.Errorf("writing into the read-only hostPath succeeded: %q", out)
	}
	if _, err := os.Stat(filepath.Join(hostRO, "new")); err == nil {
		t.Errorf("the read-only hostPath got a file from the guest")
	}

	checkPodRollbackWithShares(t, c, cacheReader, hp, hostPath)

	// A volume the shim cannot serve: a host socket, refused naming it.
	sock := filepath.Join(c.Dir, "hp.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cj = filepath.Join(c.Dir, "sock.json")
	os.WriteFile(cj, fmt.Appendf(nil, hpConfig, "socket", cubetest.ImageRef, "exec sleep 100000", sock, hostRO), 0o644)
	out, err = c.crictl("create", pod, cj, podJSON)
	if err == nil {
		_, err = c.crictl("start", strings.TrimSpace(out))
	}
	if err == nil || !strings.Contains(err.Error(), sock) || !strings.Contains(err.Error(), "socket") {
		t.Errorf("create + start with a host socket: %v, want a refusal naming %s", err, sock)
	}

	// The pod's end unbinds the host directories before its state dir goes:
	// the host's files stay.
	c.crictl("stopp", pod)
	if _, err := c.crictl("rmp", "-f", pod); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{filepath.Join(hostPath, "g"), filepath.Join(hostPath, "h"), filepath.Join(hostRO, "fixed")} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("after the pod: %v", err)
		}
	}
}

// waitHostFile waits (up to a minute) until the host file p holds want.
func waitHostFile(t *testing.T, p, want string) {
	t.Helper()
	var got []byte
	var err error
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
		if got, err = os.ReadFile(p); err == nil && string(got) == want {
			return
		}
	}
	t.Errorf("host file %s: %q %v, want %q", p, got, err, want)
}

// checkPodRollbackWithShares snapshots the pod's VM with a hostPath shared
// through virtio-fs (cube snapshot), writes into the emptyDir from the guest
// and into the hostPath from the guest and the host, and rolls the VM back
// in place (cube rollback): the emptyDir (in the VM) is back to the
// snapshot, the hostPath keeps the host's contents (it is not rolled back),
// and the file the hostPath container held open across the rollback still
// reads through the same descriptor.
func checkPodRollbackWithShares(t *testing.T, c *criEnv, cacheCtr, hpCtr, hostPath string) {
	t.Helper()
	cube := func(args ...string) (string, error) {
		global := []string{"--address", c.Dir + "/containerd.sock", "--namespace", "k8s.io", "--state", c.Dir + "/state",
			"--store-root", store.RootBeside(c.Dir + "/snaproot")}
		return c.Run(cubetest.CubeBin, append(global, args...)...)
	}
	exec := func(ctr, script string) {
		t.Helper()
		if out, err := c.crictl("exec", "-s", ctr, "sh", "-c", script); err != nil {
			t.Errorf("exec %q in %s: %q %v", script, ctr, out, err)
		}
	}
	if out, err := cube("snapshot", hpCtr, "--name", "vol-snap", "--json"); err != nil {
		t.Fatalf("snapshot of the pod's VM with a hostPath shared: %v\n%s", err, out)
	}
	exec(cacheCtr, "echo after-the-snapshot > /cache/after")
	exec(hpCtr, "echo guest-after > /hp/guest-after")
	waitHostFile(t, filepath.Join(hostPath, "guest-after"), "guest-after\n")
	os.WriteFile(filepath.Join(hostPath, "host-after"), []byte("host-after\n"), 0o644)
	if out, err := cube("rollback", hpCtr, "vol-snap", "--json"); err != nil {
		t.Fatalf("rollback of the pod's VM with a hostPath shared: %v\n%s", err, out)
	}
	execUntil := func(ctr, what, script, want string) {
		t.Helper()
		var got string
		var err error
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
			got, err = c.crictl("exec", "-s", ctr, "sh", "-c", script)
			if err == nil && strings.TrimSpace(got) == want || time.Now().After(deadline) {
				break
			}
		}
		if err != nil || strings.TrimSpace(got) != want {
			t.Errorf("%s: %q %v, want %q", what, got, err, want)
		}
	}
	// emptyDir (in the VM): back to the snapshot.
	execUntil(cacheCtr, "the emptyDir after the rollback", "cat /cache/shared; [ -e /cache/after ] && echo has-after || echo no-after",
		"from-the-writer\nno-after")
	// hostPath: the host's contents, both sides' writes since the snapshot included.
	execUntil(hpCtr, "the hostPath after the rollback", "cat /hp/g /hp/guest-after /hp/host-after", "from-the-guest\nguest-after\nhost-after")
	for _, f := range []string{"guest-after", "host-after", "g", "keep"} {
		if _, err := os.Stat(filepath.Join(hostPath, f)); err != nil {
			t.Errorf("host file after the rollback: %v", err)
		}
	}
	// The file held open across the rollback reads through the same descriptor.
	os.WriteFile(filepath.Join(hostPath, "go"), nil, 0o644)
	waitHostFile(t, filepath.Join(hostPath, "held-read"), "kept-open\n")
}
