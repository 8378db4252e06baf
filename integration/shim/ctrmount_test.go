package shim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cube-runtime/cube/integration/cubetest"
)

// TestCtrRunBindMount: `ctr run --mount type=bind,src=DIR,dst=…` of a host
// directory reaches the guest through the sandbox's virtio-fs share: the
// container reads a host file and writes one the host sees; with
// options=rbind:ro the guest's write fails and the host directory gets
// nothing; after --rm the host's files are still there.
func TestCtrRunBindMount(t *testing.T) {
	d := startDaemons(t)
	dir, ro := filepath.Join(t.TempDir(), "rw"), filepath.Join(t.TempDir(), "ro")
	for _, p := range []string{dir, ro} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dir, "in"), []byte("from-the-host\n"), 0o644)
	os.WriteFile(filepath.Join(ro, "in"), []byte("read-only\n"), 0o644)
	out, rc, err := d.Ctr("run", "--rm", "--runtime", "io.cube.v1", "--snapshotter", "cube",
		"--mount", "type=bind,src="+dir+",dst=/data,options=rbind:rw",
		"--mount", "type=bind,src="+ro+",dst=/ro,options=rbind:ro",
		cubetest.ImageRef, "bind1", "sh", "-c",
		"cat /data/in /ro/in; echo from-the-guest > /data/out; if echo x > /ro/out; then echo ro-write-ok; else echo ro-write-refused; fi; sync")
	if err != nil || rc != 0 {
		t.Fatalf("ctr run --mount: rc %d %v\n%s", rc, err, out)
	}
	for _, want := range []string{"from-the-host", "read-only", "ro-write-refused"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "out")); err != nil || string(b) != "from-the-guest\n" {
		t.Errorf("the guest's file on the host: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(ro, "out")); err == nil {
		t.Error("the read-only bind mount got a file from the guest")
	}
	if _, err := os.Stat(filepath.Join(dir, "in")); err != nil {
		t.Errorf("after ctr run --rm: %v", err)
	}
}
