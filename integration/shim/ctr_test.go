package shim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/cubetest"
)

// TestCtrRun is the user's path: containerd 2.4.2 with the cube snapshotter
// and io.cube.v1, `ctr images import`, then `ctr run --rm --runtime
// io.cube.v1 --snapshotter cube`: output and exit codes come back through
// containerd, and nothing is left running afterwards.
func TestCtrRun(t *testing.T) {
	d := startDaemons(t)
	start := time.Now()
	out, rc, err := d.Ctr("run", "--rm", "--runtime", "io.cube.v1", "--snapshotter", "cube", cubetest.ImageRef, "c1",
		"sh", "-c", "echo hello from a microVM; cat /etc/motd")
	if err != nil || rc != 0 {
		t.Fatalf("ctr run: rc %d %v", rc, err)
	}
	t.Logf("ctr run --rm (cold boot) took %v (informational)", time.Since(start))
	for _, want := range []string{"hello from a microVM", "from the image layer"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	_, rc, err = d.Ctr("run", "--rm", "--runtime", "io.cube.v1", "--snapshotter", "cube", cubetest.ImageRef, "c2", "sh", "-c", "exit 7")
	if err != nil || rc != 7 {
		t.Fatalf("ctr run exit 7: rc %d %v", rc, err)
	}
	// A rootfs from another snapshotter is refused with the way out.
	out, rc, _ = d.Ctr("run", "--rm", "--runtime", "io.cube.v1", cubetest.ImageRef, "c3", "true")
	if rc == 0 || !strings.Contains(out, "--snapshotter cube") {
		t.Errorf("overlayfs rootfs: rc %d, output lacks the snapshotter hint", rc)
	}
	if out, _, _ := d.Ctr("tasks", "ls"); strings.Contains(out, "c1") || strings.Contains(out, "c2") {
		t.Errorf("tasks left:\n%s", out)
	}
	if ents, _ := os.ReadDir(d.Dir + "/vms"); len(ents) != 0 {
		t.Errorf("sandbox state left: %v", ents)
	}
	if b, _ := os.ReadFile(filepath.Join(d.Dir, "containerd.log")); strings.Contains(string(b), "namespace is required") {
		t.Error("an event was published without a namespace")
	}
}
