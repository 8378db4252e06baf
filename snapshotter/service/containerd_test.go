package service

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-runtime/cube/snapshotter/internal/ocitar"
	"github.com/cube-runtime/cube/snapshotter/internal/xfspool"
)

// EnvContainerdBin names a directory holding containerd, ctr and
// containerd-shim-runc-v2 (v2.4.2); without it they are looked up in PATH.
const EnvContainerdBin = "CUBE_CONTAINERD_BIN"

// findTools locates the daemon test's programs, or says what is missing.
func findTools() (bins map[string]string, missing string) {
	bins = map[string]string{}
	dir := os.Getenv(EnvContainerdBin)
	for _, n := range []string{"containerd", "ctr", "containerd-shim-runc-v2", "runc"} {
		if dir != "" {
			if p := filepath.Join(dir, n); isExec(p) {
				bins[n] = p
				continue
			}
		}
		p, err := exec.LookPath(n)
		if err != nil {
			return nil, fmt.Sprintf("%s not found in $%s or PATH (run .ci/install.d/containerd.sh)", n, EnvContainerdBin)
		}
		bins[n] = p
	}
	for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		if isStatic(p) {
			bins["busybox"] = p
			return bins, ""
		}
	}
	return nil, "no static busybox (apt-get install busybox-static)"
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

func isStatic(p string) bool {
	f, err := elf.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

// testImage is busybox plus a second layer that adds a file and whites out one from the first.
func testImage(t *testing.T, busybox, name string) []byte {
	bb, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	base := []ocitar.Entry{
		{Name: "bin", Dir: true, Mode: 0o755},
		{Name: "bin/busybox", Mode: 0o755, Data: bb},
		{Name: "etc", Dir: true, Mode: 0o755},
		{Name: "etc/layer1", Mode: 0o644, Data: []byte("from layer one\n")},
		{Name: "etc/doomed", Mode: 0o644, Data: []byte("deleted by layer two\n")},
		{Name: "tmp", Dir: true, Mode: 0o1777},
		{Name: "proc", Dir: true, Mode: 0o555},
		{Name: "sys", Dir: true, Mode: 0o555},
		{Name: "dev", Dir: true, Mode: 0o755},
	}
	for _, applet := range []string{"sh", "cat", "echo", "test", "ls", "mount"} {
		base = append(base, ocitar.Entry{Name: "bin/" + applet, Linkname: "busybox"})
	}
	top := []ocitar.Entry{
		{Name: "etc", Dir: true, Mode: 0o755},
		{Name: "etc/layer2", Mode: 0o644, Data: []byte("from layer two\n")},
		ocitar.Whiteout("etc", "doomed"),
	}
	var buf bytes.Buffer
	if err := ocitar.Write(&buf, ocitar.Image{Name: name, Cmd: []string{"/bin/sh"}, Layers: [][]ocitar.Entry{base, top}}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

const containerdConfig = `version = 3
root = "%[1]s/root"
state = "%[1]s/state"
temp = "%[1]s/tmp"
imports = []
# Plugins this test does not need and which would touch host-wide paths.
disabled_plugins = [
  "io.containerd.grpc.v1.cri",
  "io.containerd.cri.v1.images",
  "io.containerd.cri.v1.runtime",
  "io.containerd.nri.v1.nri",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
]

[grpc]
  address = "%[1]s/containerd.sock"
[ttrpc]
  address = "%[1]s/containerd.sock.ttrpc"

[proxy_plugins.cube]
  type = "snapshot"
  address = "%[2]s"

[plugins."io.containerd.transfer.v1.local"]
  [[plugins."io.containerd.transfer.v1.local".unpack_config]]
    platform = "linux/%[3]s"
    snapshotter = "cube"
`

type daemon struct {
	t    *testing.T
	bins map[string]string
	sock string
	ns   string
	env  []string
}

func (d *daemon) ctr(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.bins["ctr"], append([]string{"--address", d.sock, "--namespace", d.ns}, args...)...)
	cmd.Env = d.env
	out, err := cmd.CombinedOutput()
	d.t.Logf("ctr %s:\n%s", strings.Join(args, " "), out)
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func imageFiles(t *testing.T, root string) []string {
	es, err := os.ReadDir(filepath.Join(root, "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	var n []string
	for _, e := range es {
		n = append(n, e.Name())
	}
	return n
}

// TestContainerdDaemon runs a real containerd 2.4.2 with cube as its proxy
// snapshotter: import a two-layer image, run a container from it with runc,
// then delete everything and check that containerd's GC removed our images.
func TestContainerdDaemon(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts containerd and runs a container")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: containerd, loop mounts and runc")
	}
	bins, missing := findTools()
	if missing != "" {
		t.Skip(missing)
	}
	needMkfs(t)
	pool := xfspool.New(t, 2<<30)

	dir, err := os.MkdirTemp("", "cube-ctrd-") // short: socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cleanupDir(t, dir) })

	cfg := DefaultConfig()
	cfg.Root = filepath.Join(pool, "cube")
	cfg.Address = filepath.Join(dir, "cube.sock")
	cfg.Image.DefaultSize = "256MiB"
	cfg.Image.Reflink = "required"
	svc, _, _ := startService(t, cfg)
	if svc.Status().Mode != "reflink" {
		t.Fatalf("mode %s on XFS pool", svc.Status().Mode)
	}

	conf := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(conf, fmt.Appendf(nil, containerdConfig, dir, cfg.Address, runtime.GOARCH), 0o600); err != nil {
		t.Fatal(err)
	}
	// The daemon finds the shim and runc through PATH.
	path := filepath.Dir(bins["containerd-shim-runc-v2"]) + ":" + filepath.Dir(bins["runc"]) + ":" + os.Getenv("PATH")
	env := append(os.Environ(), "PATH="+path)
	d := &daemon{t: t, bins: bins, sock: filepath.Join(dir, "containerd.sock"), ns: fmt.Sprintf("cube-test-%d", os.Getpid()), env: env}
	// runc leaves the (empty) per-namespace cgroup directories; remove them after the daemon stopped
	// (cleanups run last-registered first, so this one runs after stopDaemon).
	t.Cleanup(func() {
		dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", d.ns))
		if u := filepath.Join("/sys/fs/cgroup", d.ns); dirExists(u) {
			dirs = append(dirs, u)
		}
		for _, c := range dirs {
			if err := os.Remove(c); err != nil && !os.IsNotExist(err) {
				t.Logf("remove cgroup %s: %v", c, err)
			}
		}
	})

	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cd := exec.Command(bins["containerd"], "--config", conf, "--log-level", "debug")
	cd.Env, cd.Stdout, cd.Stderr = env, logf, logf
	cd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopDaemon(t, cd, d.sock, filepath.Join(dir, "containerd.log")) })
	waitFor(t, 30*time.Second, "containerd socket", func() bool {
		_, err := d.ctr("version")
		return err == nil
	})
	if out, err := d.ctr("plugins", "ls", "type==io.containerd.snapshotter.v1"); err != nil || !strings.Contains(out, "cube") {
		t.Fatalf("cube snapshotter not loaded: %v\n%s", err, out)
	}

	const ref = "docker.io/cube/snaptest:latest"
	tarPath := filepath.Join(dir, "image.tar")
	if err := os.WriteFile(tarPath, testImage(t, bins["busybox"], ref), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := d.ctr("images", "import", "--snapshotter", "cube", tarPath); err != nil {
		t.Fatal(err)
	}
	t.Logf("import into cube took %v (informational)", time.Since(start))
	if out, err := d.ctr("snapshots", "--snapshotter", "cube", "ls"); err != nil || strings.Count(out, "Committed") != 2 {
		t.Fatalf("expected two committed layer snapshots after import: %v\n%s", err, out)
	}
	if n := len(imageFiles(t, cfg.Root)); n != 2 {
		t.Fatalf("%d image files after import, want 2: %v", n, imageFiles(t, cfg.Root))
	}

	script := `set -e
cat /etc/layer1 /etc/layer2
if test -e /etc/doomed; then echo "whiteout ignored"; exit 1; fi
echo written-by-container > /written
cat /written
mount | while read dev on dir type fs rest; do if test "$dir" = /; then echo "rootfs $fs"; fi; done`
	start = time.Now()
	out, err := d.ctr("run", "--rm", "--snapshotter", "cube", "--runtime", "io.containerd.runc.v2", ref, "snaptest", "/bin/sh", "-c", script)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ctr run --rm with cube took %v (informational)", time.Since(start))
	for _, want := range []string{"from layer one", "from layer two", "written-by-container", "rootfs ext4"} {
		if !strings.Contains(out, want) {
			t.Errorf("container output lacks %q:\n%s", want, out)
		}
	}

	if _, err := d.ctr("images", "rm", "--sync", ref); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "containerd GC to remove the image files", func() bool {
		return len(imageFiles(t, cfg.Root)) == 0
	})
	if out, _ := d.ctr("snapshots", "--snapshotter", "cube", "ls"); strings.Contains(out, "Committed") || strings.Contains(out, "Active") {
		t.Fatalf("snapshots left:\n%s", out)
	}
	assertNoLoopOn(t, pool)
}

func waitFor(t *testing.T, limit time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stopDaemon stops containerd and any shim it started (found by the daemon's
// socket address on their command line), by PID.
func stopDaemon(t *testing.T, cd *exec.Cmd, sock, logPath string) {
	cd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { cd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Errorf("containerd did not stop on SIGTERM; killing pid %d", cd.Process.Pid)
		cd.Process.Kill()
		<-done
	}
	for _, pid := range pidsWithArg(sock) {
		t.Errorf("leftover process %d uses %s; killing it", pid, sock)
		syscall.Kill(pid, syscall.SIGKILL)
	}
	if t.Failed() {
		if b, err := os.ReadFile(logPath); err == nil {
			if len(b) > 20000 {
				b = b[len(b)-20000:]
			}
			t.Logf("containerd log (tail of %d bytes):\n%s", len(b), b)
		}
	}
}

func pidsWithArg(arg string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(arg)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// cleanupDir unmounts anything containerd left mounted under dir, then removes it.
func cleanupDir(t *testing.T, dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err == nil {
		var mnts []string
		s := bufio.NewScanner(f)
		for s.Scan() {
			fs := strings.Fields(s.Text())
			if len(fs) > 4 && strings.HasPrefix(fs[4], dir+"/") {
				mnts = append(mnts, fs[4])
			}
		}
		f.Close()
		for i := len(mnts) - 1; i >= 0; i-- {
			t.Errorf("mount left under test dir: %s", mnts[i])
			syscall.Unmount(mnts[i], syscall.MNT_DETACH)
		}
	}
	os.RemoveAll(dir)
}

func assertNoLoopOn(t *testing.T, pool string) {
	out, err := exec.Command("losetup", "-a").Output()
	if err != nil {
		return
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, pool+"/") {
			t.Errorf("loop device still attached to an image: %s", l)
		}
	}
}

// TestContribSnippet checks that the shipped containerd snippet parses in
// containerd 2.4.2 and keeps the three pieces cube needs.
func TestContribSnippet(t *testing.T) {
	bins, missing := findTools()
	if missing != "" {
		t.Skip(missing)
	}
	snippet, err := filepath.Abs("../../contrib/containerd/cube-snapshotter.toml")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bins["containerd"], "--config", snippet, "config", "dump").CombinedOutput()
	if err != nil {
		t.Fatalf("containerd config dump: %v\n%s", err, out)
	}
	dump := string(out)
	for _, want := range []string{
		"[proxy_plugins.cube]\n    type = 'snapshot'\n    address = '" + DefaultAddress + "'",
		"platform = 'linux/amd64'\n      snapshotter = 'cube'",
		"[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.cube]\n          runtime_type = 'io.cube.v1'",
		"[plugins.'io.containerd.cri.v1.images'.runtime_platforms.cube]",
	} {
		if !strings.Contains(dump, want) {
			t.Errorf("config dump lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(dump)
	}
	// The runtime's snapshotter line follows its runtime_type block.
	j := strings.Index(dump, "runtimes.cube]")
	if j < 0 {
		t.Fatal("no runtimes.cube section")
	}
	rt := dump[j:]
	if i := strings.Index(rt, "snapshotter = "); i < 0 || !strings.HasPrefix(rt[i:], "snapshotter = 'cube'") {
		t.Errorf("runtime cube has no snapshotter = 'cube'")
	}
}

func dirExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}
