package shim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/integration/cubetest"
	"github.com/cube-runtime/cube/shim/sandbox"
)

// A host-network pod of its own name (two pods at once need two names).
const criBlockPodConfig = `{
  "metadata": {"name": "%[1]s", "namespace": "default", "uid": "%[1]s-uid", "attempt": 0},
  "log_directory": "%[2]s",
  "linux": {"security_context": {"namespace_options": {"network": 2, "pid": 1}}}
}`

// A container with a raw block volume as the kubelet passes a
// volumeDevice: CRI devices (host_path, container_path, permissions).
const criBlockContainerConfig = `{
  "metadata": {"name": "%[1]s"},
  "image": {"image": "%[2]s"},
  "command": ["/bin/sh", "-c", "exec sleep 100000"],
  "log_path": "%[1]s.log",
  "devices": [{"container_path": "/dev/xvda", "host_path": "%[3]s", "permissions": "%[4]s"}],
  "linux": {"security_context": {"namespace_options": {"network": 2, "pid": 1}}}
}`

// blockVolumeSize is the loop device's size: not the stub's, so the guest
// must see the new medium's capacity.
const blockVolumeSize = 4 << 20

// TestCRIPodBlockVolume: a loop device of the test host is a CRI pod
// container's raw block volume at /dev/xvda (read-write). The container
// reads what the host wrote on the device, and writes a marker with dd that
// the host reads back from the loop device. A container of a second pod
// asking for the same device read-write is refused with the claim error
// (naming the device and the holder). After the first pod is removed its
// slot and claim are gone: the second pod's new container takes the device,
// and deleting that container releases the claim while its pod runs. A
// read-only container (permissions "r") reads the device and cannot write it.
func TestCRIPodBlockVolume(t *testing.T) {
	c := startCRI(t)
	img := filepath.Join(c.Dir, "blockvol.img")
	if err := os.WriteFile(img, make([]byte, blockVolumeSize), 0o600); err != nil {
		t.Fatal(err)
	}
	// Ordering: registered before the pods' cleanups, so it runs after them.
	dev := cubetest.LoopDevice(t, img)
	hostMark := fmt.Sprintf("from-the-host-%d", time.Now().UnixNano())
	writeAt(t, dev, 4096, hostMark)
	claims := filepath.Join(c.Dir, "vms", sandbox.BlockClaimDirName)

	podA := runBlockPod(t, c, "blockpod-a")
	a := createStartBlock(t, c, podA, "writer", dev, "rw")
	if a.err != nil {
		t.Fatalf("container with the block volume: %v", a.err)
	}
	guestMark := fmt.Sprintf("from-the-guest-%d", time.Now().UnixNano())
	out, err := c.crictl("exec", "-s", a.id, "sh", "-c",
		"busybox ls -l /dev/xvda && busybox dd if=/dev/xvda bs=4096 skip=1 count=1 2>/dev/null | busybox head -c "+fmt.Sprint(len(hostMark))+
			" && echo && echo "+guestMark+" | busybox dd of=/dev/xvda conv=fsync 2>&1")
	if err != nil {
		t.Fatalf("dd in the container: %v", err)
	}
	if !strings.Contains(out, hostMark) {
		t.Errorf("the container read %q from /dev/xvda at 4096, want the host's %q (is the slot's medium the loop device?)", out, hostMark)
	}
	if got := readAt(t, dev, 0, guestMark); got != guestMark {
		t.Errorf("host read %q from %s, want the container's marker %q", got, dev, guestMark)
	}
	if h := holders(claims); len(h) != 1 {
		t.Errorf("claims %v, want one (pod A's)", h)
	}

	// The same device read-write in another pod (VM): refused.
	podB := runBlockPod(t, c, "blockpod-b")
	b := createStartBlock(t, c, podB, "thief", dev, "rw")
	if b.err == nil || !strings.Contains(b.err.Error(), dev) || !strings.Contains(b.err.Error(), "is attached to sandbox") {
		t.Fatalf("second pod's container with the same device: %v, want the claim error naming %s and its holder", b.err, dev)
	}
	t.Logf("refused as expected: %v", b.err)
	if b.id != "" {
		c.crictl("rm", b.id)
	}

	// Pod A's end releases the slot and the claim.
	c.crictl("stopp", podA.id)
	if _, err := c.crictl("rmp", podA.id); err != nil {
		t.Fatal(err)
	}
	if h := holders(claims); len(h) != 0 {
		t.Errorf("claims after pod A's removal: %v", h)
	}
	d := createStartBlock(t, c, podB, "heir", dev, "rw")
	if d.err != nil {
		t.Fatalf("after pod A's removal, pod B's container with the device: %v", d.err)
	}
	again := fmt.Sprintf("second-owner-%d", time.Now().UnixNano())
	if _, err := c.crictl("exec", "-s", d.id, "sh", "-c", "echo "+again+" | busybox dd of=/dev/xvda conv=fsync 2>&1"); err != nil {
		t.Fatal(err)
	}
	if got := readAt(t, dev, 0, again); got != again {
		t.Errorf("host read %q, want pod B's marker %q", got, again)
	}
	// Deleting the container (its pod runs on) gives the device back.
	c.crictl("stop", "-t", "0", d.id)
	if _, err := c.crictl("rm", d.id); err != nil {
		t.Fatal(err)
	}
	if h := holders(claims); len(h) != 0 {
		t.Errorf("claims after the container's removal: %v", h)
	}
	// Read-only (CRI permissions "r"): the guest reads the device, its
	// writes fail (the VMM's read-only medium), the host's bytes stay.
	r := createStartBlock(t, c, podB, "reader", dev, "r")
	if r.err != nil {
		t.Fatalf("read-only container: %v", r.err)
	}
	out, err = c.crictl("exec", "-s", r.id, "sh", "-c", "busybox dd if=/dev/xvda bs="+fmt.Sprint(len(again))+" count=1 2>/dev/null")
	if err != nil || strings.TrimSpace(out) != again { // crictl exec ends its output with newlines
		t.Errorf("read-only container read %q (%v), want %q", out, err, again)
	}
	if out, err := c.crictl("exec", "-s", r.id, "sh", "-c", "echo overwritten | busybox dd of=/dev/xvda conv=fsync"); err == nil {
		t.Errorf("a write to the read-only block volume succeeded: %q", out)
	}
	if got := readAt(t, dev, 0, again); got != again {
		t.Errorf("after the read-only container's write, the host reads %q, want %q", got, again)
	}
	c.crictl("stopp", podB.id)
	if _, err := c.crictl("rmp", podB.id); err != nil {
		t.Fatal(err)
	}
}

// blockPod is a running pod and its CRI config file.
type blockPod struct{ id, config string }

// runBlockPod runs a pod named name with the cube handler; a cleanup removes it.
func runBlockPod(t *testing.T, c *criEnv, name string) blockPod {
	t.Helper()
	podJSON := filepath.Join(c.Dir, name+".json")
	os.WriteFile(podJSON, fmt.Appendf(nil, criBlockPodConfig, name, filepath.Join(c.Dir, name+"-logs")), 0o644)
	out, err := c.crictl("runp", "--runtime", "cube", podJSON)
	if err != nil {
		t.Fatal(err)
	}
	pod := strings.TrimSpace(out)
	t.Cleanup(func() {
		c.crictl("stopp", pod)
		c.crictl("rmp", "-f", pod)
	})
	return blockPod{id: pod, config: podJSON}
}

type blockContainer struct {
	id  string
	err error // of create or start
}

// createStartBlock creates and starts container name in pod with dev at
// /dev/xvda (CRI makes the task, where the shim sees the devices, at start).
func createStartBlock(t *testing.T, c *criEnv, pod blockPod, name, dev, perms string) blockContainer {
	t.Helper()
	cj := filepath.Join(c.Dir, name+".json")
	os.WriteFile(cj, fmt.Appendf(nil, criBlockContainerConfig, name, cubetest.ImageRef, dev, perms), 0o644)
	out, err := c.crictl("create", pod.id, cj, pod.config)
	if err != nil {
		return blockContainer{err: err}
	}
	id := strings.TrimSpace(out)
	_, err = c.crictl("start", id)
	return blockContainer{id: id, err: err}
}

// holders lists the claim holder files of the claims directory.
func holders(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".lock") {
			out = append(out, e.Name())
		}
	}
	return out
}

func writeAt(t *testing.T, dev string, off int64, s string) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte(s), off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// readAt reads len(want) bytes of dev at off until they are want (30 s at
// most: the guest's write reaches the device through the VMM) and returns
// the last read.
func readAt(t *testing.T, dev string, off int64, want string) string {
	t.Helper()
	buf := make([]byte, len(want))
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		f, err := os.Open(dev)
		if err != nil {
			t.Fatal(err)
		}
		// Drop the host's cached blocks of the device: the VMM's writes
		// may have bypassed them.
		if err := unix.IoctlSetInt(int(f.Fd()), unix.BLKFLSBUF, 0); err != nil {
			t.Logf("BLKFLSBUF %s: %v", dev, err)
		}
		_, err = f.ReadAt(buf, off)
		f.Close()
		if err != nil {
			t.Fatalf("read %s: %v", dev, err)
		}
		if string(buf) == want || time.Now().After(deadline) {
			return string(buf)
		}
	}
}
