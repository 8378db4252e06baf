package shim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cube-runtime/cube/integration/cubetest"
	"github.com/cube-runtime/cube/shim/template"
)

// TestTemplatesByDefault: with the default configuration (templates on; only
// template_dir moved to a fresh directory so the first use is seen), the
// first `ctr run` makes the template and restores from it, the second reuses
// it, and after the initrd changes (a copy with zeros appended: the kernel's
// initramfs unpacker skips NUL padding) a new template is made under a new
// key; `cube templates ls|rm` list and remove them.
func TestTemplatesByDefault(t *testing.T) {
	d := startDaemons(t)
	tdir := filepath.Join(d.Dir, "templates")
	base := fmt.Sprintf(cubetest.ShimConfig, cubetest.CubeVMM, cubetest.GuestKernel, cubetest.GuestInitrd, d.Dir) + fmt.Sprintf("template_dir = %q\n", tdir)
	conf := filepath.Join(d.Dir, "shim-tmpl.toml")
	if err := os.WriteFile(conf, []byte(base), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(conf, id string) string {
		t.Helper()
		from := d.LogSize()
		args := append(append([]string{"run", "--rm", "--runtime-config-path", conf}, cubetest.CubeRuntime.Args...), cubetest.ImageRef, id, "echo", "hello-"+id)
		out, rc, err := d.Ctr(args...)
		if err != nil || rc != 0 || !strings.Contains(out, "hello-"+id) {
			t.Fatalf("ctr run %s: rc %d %v\n%s", id, rc, err, out)
		}
		return d.LogFrom(from)
	}
	keys := func() []template.Info {
		t.Helper()
		l, err := template.List(tdir)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}

	// First use: made, then restored from.
	log1 := run(conf, "tmpl1")
	if strings.Count(log1, cubetest.LogTemplateMade) != 1 || !strings.Contains(log1, cubetest.LogRestoring) {
		t.Fatalf("first run: want one %q and %q in the shim log; got:\n%s", cubetest.LogTemplateMade, cubetest.LogRestoring, cubetest.GrepLines(log1, "template"))
	}
	l := keys()
	if len(l) != 1 || l[0].Meta.Key != l[0].Key || l[0].Failed != "" {
		t.Fatalf("templates after the first run: %+v", l)
	}
	first := l[0]

	// Second use: the same template, not made again.
	log2 := run(conf, "tmpl2")
	if strings.Contains(log2, cubetest.LogTemplateMade) || !strings.Contains(log2, cubetest.LogRestoring) || strings.Contains(log2, cubetest.LogNoTemplate) {
		t.Fatalf("second run: want the template reused; shim log:\n%s", cubetest.GrepLines(log2, "template"))
	}
	if l := keys(); len(l) != 1 || !l[0].Meta.Created.Equal(first.Meta.Created) {
		t.Fatalf("templates after the second run: %+v, want only %+v", l, first)
	}

	// A changed initrd: a new key, made on its first use.
	img, err := os.ReadFile(cubetest.GuestInitrd)
	if err != nil {
		t.Fatal(err)
	}
	initrd2 := filepath.Join(d.Dir, "initrd2.img")
	if err := os.WriteFile(initrd2, append(img, make([]byte, 512)...), 0o644); err != nil {
		t.Fatal(err)
	}
	conf2 := filepath.Join(d.Dir, "shim-tmpl2.toml")
	body2 := fmt.Sprintf(cubetest.ShimConfig, cubetest.CubeVMM, cubetest.GuestKernel, initrd2, d.Dir) + fmt.Sprintf("template_dir = %q\n", tdir)
	if err := os.WriteFile(conf2, []byte(body2), 0o644); err != nil {
		t.Fatal(err)
	}
	log3 := run(conf2, "tmpl3")
	if strings.Count(log3, cubetest.LogTemplateMade) != 1 || !strings.Contains(log3, cubetest.LogRestoring) {
		t.Fatalf("run with a new initrd: want the template made again; shim log:\n%s", cubetest.GrepLines(log3, "template"))
	}
	l = keys()
	if len(l) != 2 || l[0].Key != first.Key || l[1].Meta.Digests["initrd"] == first.Meta.Digests["initrd"] {
		t.Fatalf("templates after the initrd changed: %+v", l)
	}

	second := l[1].Key
	// The CLI lists both and removes the old one.
	out, rc := d.Cube(t, "templates", "ls", "--dir", tdir)
	if rc != 0 || !strings.Contains(out, first.Key) || !strings.Contains(out, second) || !strings.Contains(out, "initrd2.img") {
		t.Fatalf("cube templates ls: rc %d\n%s", rc, out)
	}
	if out, rc := d.Cube(t, "templates", "rm", "--dir", tdir, first.Key); rc != 0 {
		t.Fatalf("cube templates rm: rc %d\n%s", rc, out)
	}
	if l := keys(); len(l) != 1 || l[0].Key != second {
		t.Fatalf("templates after rm: %+v", l)
	}
}

// TestCRIPodFromTemplate: a host-network CRI pod (no NIC: a template can
// serve it) with the default configuration starts from a template (made
// now or by an earlier test: the default template_dir is shared), and an
// app container of the pod takes a drive slot of the restored VM and runs.
func TestCRIPodFromTemplate(t *testing.T) {
	c := startCRI(t)
	podJSON := filepath.Join(c.Dir, "pod.json")
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
	b, _ := os.ReadFile(filepath.Join(c.Dir, "containerd.log"))
	if log := string(b); !strings.Contains(log, cubetest.LogRestoring) || strings.Contains(log, cubetest.LogNoTemplate) {
		t.Fatalf("pod sandbox not restored from a template; shim log:\n%s", cubetest.GrepLines(log, "template"))
	}
	cj := filepath.Join(c.Dir, "app.json")
	os.WriteFile(cj, fmt.Appendf(nil, criContainerConfig, "app", cubetest.ImageRef), 0o644)
	out, err = c.crictl("create", pod, cj, podJSON)
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	if _, err := c.crictl("start", id); err != nil {
		t.Fatal(err)
	}
	got, err := c.crictl("exec", "-s", id, "sh", "-c", "cat /etc/motd; echo in-app")
	if err != nil || !strings.Contains(got, "from the image layer") || !strings.Contains(got, "in-app") {
		t.Fatalf("crictl exec -s in the app container: %q %v", got, err)
	}
}
