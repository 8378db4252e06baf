package shim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
// directory is refused naming the mount and virtio-fs.
func TestCRIPodVolumes(t *testing.T) {
	c := startCRI(t)
	podDir := filepath.Join(c.dir, "kubelet", "pods", "0c9e7a52-5b1d-4f0e-9d3c-2a7b6e8f1d40")
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

	podJSON := filepath.Join(c.dir, "volpod.json")
	os.WriteFile(podJSON, fmt.Appendf(nil, criPodConfig, filepath.Join(c.dir, "podlogs")), 0o644)
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
		cj := filepath.Join(c.dir, name+".json")
		os.WriteFile(cj, fmt.Appendf(nil, criVolumeContainerConfig, name, imageRef, script, cache, cfg), 0o644)
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

	// hostPath: refused, naming the mount and why.
	hostPath := filepath.Join(c.dir, "hostpath")
	os.MkdirAll(hostPath, 0o755)
	cj := filepath.Join(c.dir, "hp.json")
	os.WriteFile(cj, fmt.Appendf(nil, strings.Replace(criVolumeContainerConfig, `"host_path": "%[5]s", "readonly": true`, `"host_path": "%[5]s"`, 1),
		"hostpath", imageRef, "exec sleep 100000", cache, hostPath), 0o644)
	// CRI makes the task (where the shim sees the spec) at start.
	out, err = c.crictl("create", pod, cj, podJSON)
	if err == nil {
		_, err = c.crictl("start", strings.TrimSpace(out))
	}
	if err == nil || !strings.Contains(err.Error(), hostPath) || !strings.Contains(err.Error(), "virtio-fs") {
		t.Errorf("create + start with a hostPath directory: %v, want a refusal naming %s and virtio-fs", err, hostPath)
	}
}
