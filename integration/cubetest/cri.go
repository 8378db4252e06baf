package cubetest

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
)

// criContainerdConfig is containerd with the CRI plugin on and the contrib
// snippet imported; the pinned sandbox image is a local one (no registry) unless CRIOptions says otherwise.
// runc (CRI's default handler, the reference beside cube) does not pivot_root: the test host's / is its
// initramfs. %[3]s is CRIOptions.Config.
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
  sandbox = "%[4]s"

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["` + CNIBinDir + `"]
  conf_dir = "%[1]s/net.d"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
    NoPivotRoot = true
%[3]s`

// CRIOptions is what a test adds to StartCRI's containerd.
type CRIOptions struct {
	// Config is appended to containerd's config (TOML tables the base config does not define).
	Config string
	// SandboxImage is the pods' pause image (default PauseImageRef, imported by StartCRI).
	SandboxImage string
}

// CRI is containerd 2.4.2 with its CRI plugin in the test host (StartCRI), driven through crictl and ctr.
type CRI struct {
	T   *testing.T
	Dir string
	Env []string
	// PodNet: the CNI plugins are in the test host and containerd has their
	// config (CRIPodNetwork), so pods may have a network of their own.
	PodNet bool
}

// Run runs bin with the test's environment (5 minutes at most), logs its output and returns its stdout; a
// failure's error carries its stderr.
func (c *CRI) Run(bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = c.Env
	cmd.WaitDelay = 10 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	c.T.Logf("%s %s:\n%s%s", filepath.Base(bin), strings.Join(args, " "), stdout.String(), stderr.String())
	if err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", filepath.Base(bin), strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// Endpoint is the CRI endpoint (the runtime and the image service) as crictl and critest take it.
func (c *CRI) Endpoint() string { return "unix://" + c.Dir + "/containerd.sock" }

func (c *CRI) Crictl(args ...string) (string, error) {
	sock := c.Endpoint()
	// crictl's default timeout (2 s) is shorter than a VM boot in the test host.
	return c.Run(CrictlBin, append([]string{"--runtime-endpoint", sock, "--image-endpoint", sock, "--timeout", "300s"}, args...)...)
}

// Ctr is ctr in CRI's namespace, k8s.io.
func (c *CRI) Ctr(args ...string) (string, error) {
	return c.Run(CtrBin, append([]string{"--address", c.Dir + "/containerd.sock", "--namespace", "k8s.io"}, args...)...)
}

// StartCRI starts cube-snapshotter on the contrib config's socket and
// containerd with its CRI plugin, and imports the e2e and pause images into
// the k8s.io namespace (unpacked into the cube snapshotter and overlayfs, for runc); cleanups stop them.
func StartCRI(t *testing.T, o CRIOptions) *CRI {
	for _, p := range []string{ContainerdBin, CtrBin, CrictlBin} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("%s not in the test host: it was not found on the machine (.ci/install.d/containerd.sh installs containerd, ctr and crictl)", filepath.Base(p))
		}
	}
	if _, err := os.Stat(CRIContribConfig); err != nil {
		t.Fatalf("contrib config not in the test host: %v", err)
	}
	dir, err := os.MkdirTemp("/tmp", "cri") // short: Unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c := &CRI{T: t, Dir: dir, Env: append(os.Environ(), "PATH=/cube/bin:"+os.Getenv("PATH"))}
	DumpConsolesOnFailure(t, dir, 60)

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
	c.PodNet = CRIPodNetwork(t, c)
	WriteShimConfig(t, dir)
	if err := os.MkdirAll(filepath.Dir(CRISnapshotterSock), 0o755); err != nil {
		t.Fatal(err)
	}
	StartSnapshotter(t, dir, c.Env, CRISnapshotterSock)

	conf := filepath.Join(dir, "config.toml")
	sandbox := o.SandboxImage
	if sandbox == "" {
		sandbox = PauseImageRef
	}
	os.WriteFile(conf, fmt.Appendf(nil, criContainerdConfig, dir, CRIContribConfig, o.Config, sandbox), 0o600)
	cdLog, _ := os.Create(filepath.Join(dir, "containerd.log"))
	cd := exec.Command(ContainerdBin, "--config", conf, "--log-level", "debug")
	cd.Env, cd.Stdout, cd.Stderr = c.Env, cdLog, cdLog
	cd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Stop(t, cd, filepath.Join(dir, "containerd.log")) })

	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := c.Crictl("info"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("containerd's CRI did not come up")
		}
		time.Sleep(time.Second)
	}
	c.importImages(t)
	return c
}

// importImages imports the e2e and pause images (unpacked for cube and for runc) and waits until CRI lists them.
func (c *CRI) importImages(t *testing.T) {
	pause, err := OCIImageTar("/bin/busybox", PauseImageRef, []string{"sleep"}, "/bin/sleep", "2147483647")
	if err != nil {
		t.Fatal(err)
	}
	pauseTar := filepath.Join(c.Dir, "pause.tar")
	if err := os.WriteFile(pauseTar, pause, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tar := range []string{ImageTar, pauseTar} {
		for _, sn := range []string{"cube", "overlayfs"} {
			if _, err := c.Ctr("images", "import", "--snapshotter", sn, tar); err != nil {
				t.Fatal(err)
			}
		}
	}
	// CRI learns of imported images from events: wait until it lists both.
	for deadline := time.Now().Add(60 * time.Second); ; {
		out, err := c.Crictl("images", "-q")
		if err == nil && strings.Count(out, "sha256:") >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CRI does not list the imported images: %v", err)
		}
		time.Sleep(time.Second)
	}
}
