package shim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/cubetest"
	"github.com/cube-runtime/cube/shim/sandbox"
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
	conf := d.shimConfWith(t, "shim-tmpl.toml", cubetest.GuestInitrd, fmt.Sprintf("template_dir = %q\n", tdir))
	keys := func() []template.Info {
		t.Helper()
		l, err := template.List(tdir)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}

	// First use: made, then restored from.
	log1 := d.runEcho(t, conf, "tmpl1")
	if strings.Count(log1, cubetest.LogTemplateMade) != 1 || !strings.Contains(log1, cubetest.LogRestoring) {
		t.Fatalf("first run: want one %q and %q in the shim log; got:\n%s", cubetest.LogTemplateMade, cubetest.LogRestoring, cubetest.GrepLines(log1, "template"))
	}
	l := keys()
	if len(l) != 1 || l[0].Meta.Key != l[0].Key || l[0].Failed != "" {
		t.Fatalf("templates after the first run: %+v", l)
	}
	first := l[0]

	// Second use: the same template, not made again.
	log2 := d.runEcho(t, conf, "tmpl2")
	if strings.Contains(log2, cubetest.LogTemplateMade) || !strings.Contains(log2, cubetest.LogRestoring) || strings.Contains(log2, cubetest.LogNoTemplate) {
		t.Fatalf("second run: want the template reused; shim log:\n%s", cubetest.GrepLines(log2, "template"))
	}
	if l := keys(); len(l) != 1 || !l[0].Meta.Created.Equal(first.Meta.Created) {
		t.Fatalf("templates after the second run: %+v, want only %+v", l, first)
	}
	// The restored guest's clock, RNG and rootfs mount were one agent call
	// (Freshen): the initrd's agent has it, so no fallback was logged.
	if strings.Contains(log1+log2, sandbox.LogOlderAgentFreshen) || !strings.Contains(cubetest.GrepLines(log2, "rootfs attached"), "mount=") {
		t.Fatalf("restored guest not freshened and mounted in one call; shim log:\n%s", cubetest.GrepLines(log1+log2, "Freshen")+cubetest.GrepLines(log2, "rootfs attached"))
	}
	if strings.Contains(log1+log2, cubetest.LogStandbyStarted) {
		t.Fatalf("standby VMs are off by default, but a run left one:\n%s", cubetest.GrepLines(log1+log2, "standby"))
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
	conf2 := d.shimConfWith(t, "shim-tmpl2.toml", initrd2, fmt.Sprintf("template_dir = %q\n", tdir))
	log3 := d.runEcho(t, conf2, "tmpl3")
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

// TestCRIPodNetworkFromTemplate: a CRI pod with CNI networking (default
// configuration) is restored from the automatic template with one NIC
// (made now or by an earlier test: template_dir is shared), the NIC now on
// the pod's tap: the guest has the pod's own address, answers the test host
// at it and reaches a server on the test host (checkPodNetwork); a second
// networked pod is restored from the same template, not made again, with
// its own address, and the two reach each other (checkPodToPod).
//
// Then, informational (t.Logf, no assertion on time): `crictl runp` of a
// networked pod from the template beside one of handler cube-cold (the same
// shim with templates = false), one at a time.
func TestCRIPodNetworkFromTemplate(t *testing.T) {
	c := &criEnv{cubetest.StartCRI(t, cubetest.CRIOptions{Config: coldHandler})}
	coldConf := fmt.Sprintf(cubetest.ShimConfig, cubetest.CubeVMM, cubetest.GuestKernel, cubetest.GuestInitrd, c.Dir) + "templates = false\n"
	if err := os.WriteFile(coldShimConfig, []byte(coldConf), 0o644); err != nil {
		t.Fatal(err)
	}
	podJSON := filepath.Join(c.Dir, "pod.json")
	os.WriteFile(podJSON, fmt.Appendf(nil, withPodNetwork(criPodConfig), filepath.Join(c.Dir, "podlogs")), 0o644)
	start := time.Now()
	out, err := c.crictl("runp", "--runtime", "cube", podJSON)
	if err != nil {
		t.Fatal(err)
	}
	pod := strings.TrimSpace(out)
	t.Logf("crictl runp of a networked pod (template made now or earlier, then restored) took %v (informational)", time.Since(start))
	t.Cleanup(func() {
		c.crictl("stopp", pod)
		c.crictl("rmp", "-f", pod)
	})
	log1 := c.LogFrom(0)
	restored := cubetest.GrepLines(log1, cubetest.LogRestoring)
	if !strings.Contains(restored, "nics=1") || strings.Contains(log1, "cold boot") {
		t.Fatalf("networked pod not restored from a template with a NIC; shim log:\n%s", cubetest.GrepLines(log1, "template"))
	}
	cj := filepath.Join(c.Dir, "c1.json")
	os.WriteFile(cj, fmt.Appendf(nil, withPodNetwork(criContainerConfig), "c1", cubetest.ImageRef), 0o644)
	out, err = c.crictl("create", pod, cj, podJSON)
	if err != nil {
		t.Fatal(err)
	}
	ctr := strings.TrimSpace(out)
	if _, err := c.crictl("start", ctr); err != nil {
		t.Fatal(err)
	}
	checkPodNetwork(t, c, pod, ctr, ctr)

	from := c.LogSize()
	checkPodToPod(t, c, pod, ctr, ctr)
	log2 := c.LogFrom(from)
	if !strings.Contains(cubetest.GrepLines(log2, cubetest.LogRestoring), "nics=1") || strings.Contains(log2, cubetest.LogTemplateMade) ||
		strings.Contains(log2, "cold boot") {
		t.Errorf("second networked pod: want the NIC template reused; shim log:\n%s", cubetest.GrepLines(log2, "template"))
	}

	timed := func(handler, name string) time.Duration {
		pj := filepath.Join(c.Dir, name+".json")
		os.WriteFile(pj, fmt.Appendf(nil, strings.ReplaceAll(withPodNetwork(criPodConfig), "cube-pod", name), filepath.Join(c.Dir, name+"logs")), 0o644)
		start := time.Now()
		out, err := c.crictl("runp", "--runtime", handler, pj)
		took := time.Since(start)
		if id := strings.TrimSpace(out); id != "" {
			c.crictl("stopp", id)
			c.crictl("rmp", "-f", id)
		}
		if err != nil {
			t.Logf("runp %s (%s) for the comparison failed: %v", name, handler, err)
			return 0
		}
		return took
	}
	tmpl, cold := timed("cube", "cube-pod3"), timed("cube-cold", "cube-pod4")
	if tmpl > 0 && cold > 0 {
		t.Logf("crictl runp of a networked pod: from the NIC template %v, cold boot %v: %.2fx (informational)",
			tmpl.Round(time.Millisecond), cold.Round(time.Millisecond), float64(tmpl)/float64(cold))
	}
}

// coldShimConfig is the shim config of CRI handler cube-cold (coldHandler):
// the test's shim config with templates = false.
const coldShimConfig = "/etc/cube/shim-cold.toml"

// coldHandler is a CRI runtime handler "cube-cold": io.cube.v1 with
// coldShimConfig.
const coldHandler = `
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.cube-cold]
  runtime_type = "io.cube.v1"
  snapshotter = "cube"
  pod_annotations = ["io.cube.*"]
  container_annotations = ["io.cube.*"]
  privileged_without_host_devices = true
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.cube-cold.options]
    ConfigPath = "` + coldShimConfig + `"
`

// shimConfWith writes the shim config StartDaemons writes, with initrd as the
// guest initrd and the TOML lines extra appended, to d.Dir/name, and returns
// its path (for `ctr run --runtime-config-path`).
func (d *daemons) shimConfWith(t *testing.T, name, initrd, extra string) string {
	t.Helper()
	conf := filepath.Join(d.Dir, name)
	body := fmt.Sprintf(cubetest.ShimConfig, cubetest.CubeVMM, cubetest.GuestKernel, initrd, d.Dir) + extra
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return conf
}

// runEcho runs `ctr run --rm … ID echo hello-ID` with the shim config conf
// and returns containerd's log of the run (the shim's lines in it); it fails t
// unless the greeting came back, showing the log lines that name the run.
func (d *daemons) runEcho(t *testing.T, conf, id string) string {
	t.Helper()
	from := d.LogSize()
	args := append(append([]string{"run", "--rm", "--runtime-config-path", conf}, cubetest.CubeRuntime.Args...), cubetest.ImageRef, id, "echo", "hello-"+id)
	out, rc, err := d.Ctr(args...)
	if err != nil || rc != 0 || !strings.Contains(out, "hello-"+id) {
		t.Fatalf("ctr run %s: rc %d %v\n%s\nshim log:\n%s", id, rc, err, out, cubetest.GrepLines(d.LogFrom(from), id))
	}
	return d.LogFrom(from)
}
