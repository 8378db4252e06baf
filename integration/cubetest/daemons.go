package cubetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-runtime/cube/shim/standby"
)

const containerdConfig = `version = 3
root = "%[1]s/root"
state = "%[1]s/state"
temp = "%[1]s/tmp"
imports = []
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
  address = "%[1]s/snap.sock"

[plugins."io.containerd.transfer.v1.local"]
  [[plugins."io.containerd.transfer.v1.local".unpack_config]]
    platform = "linux/amd64"
    snapshotter = "cube"
`

const ShimConfig = `vmm = "%s"
kernel = "%s"
initrd = "%s"
cmdline = "console=ttyS0 panic=-1 quiet"
state_dir = "%s/vms"
boot_timeout = "5m"
`

// Daemons is containerd (with the cube snapshotter) running in the test host.
type Daemons struct {
	Dir        string
	Env        []string
	tb         testing.TB
	Containerd *exec.Cmd // containerd
}

// StartContainerd starts containerd with the config in d.Dir (appending to
// its log, so a restart keeps the first run's lines) and waits until it answers.
func (d *Daemons) StartContainerd() error {
	cdLog, err := os.OpenFile(filepath.Join(d.Dir, "containerd.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer cdLog.Close() // the child has its own copy
	cd := exec.Command(ContainerdBin, "--config", filepath.Join(d.Dir, "config.toml"), "--log-level", "debug")
	cd.Env, cd.Stdout, cd.Stderr = d.Env, cdLog, cdLog
	cd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cd.Start(); err != nil {
		return fmt.Errorf("start containerd: %w", err)
	}
	d.Containerd = cd
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, rc, err := d.CtrQuiet(nil, "version"); err == nil && rc == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("containerd did not come up in 60s")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// StartDaemons starts cube-snapshotter and containerd 2.4.2, writes the
// shim's config, and imports the busybox image; cleanups stop them.
func StartDaemons(tb testing.TB) *Daemons {
	for _, p := range []string{ContainerdBin, CtrBin} {
		if _, err := os.Stat(p); err != nil {
			tb.Skipf("%s not in the test host: containerd 2.4.2 and ctr were not found on the machine (.ci/install.d/containerd.sh installs them)", filepath.Base(p))
		}
	}
	dir, err := os.MkdirTemp("/tmp", "ctrd") // short: Unix socket paths
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	DumpConsolesOnFailure(tb, dir, 40)
	// Ordering: runs after containerd and the snapshotter stopped (cleanups
	// run last-registered first), so no shim makes a standby meanwhile.
	tb.Cleanup(func() { StopStandbys(tb, filepath.Join(dir, "vms")) })
	d := &Daemons{Dir: dir, tb: tb, Env: append(os.Environ(), "PATH=/cube/bin:"+os.Getenv("PATH"))}
	WriteShimConfig(tb, dir)
	StartSnapshotter(tb, dir, d.Env, dir+"/snap.sock")

	os.WriteFile(filepath.Join(dir, "config.toml"), fmt.Appendf(nil, containerdConfig, dir), 0o600)
	// d.Containerd at cleanup time, not now: TestCtrTasks restarts containerd.
	tb.Cleanup(func() {
		if d.Containerd != nil {
			Stop(tb, d.Containerd, filepath.Join(dir, "containerd.log"))
		}
	})
	if err := d.StartContainerd(); err != nil {
		tb.Fatal(err)
	}
	if _, rc, err := d.Ctr("images", "import", ImageTar); err != nil || rc != 0 {
		tb.Fatalf("import for overlayfs: rc %d %v", rc, err)
	}
	if _, rc, err := d.Ctr("images", "import", "--snapshotter", "cube", ImageTar); err != nil || rc != 0 {
		tb.Fatalf("import: rc %d %v", rc, err)
	}
	return d
}

// DumpConsolesOnFailure shows, when the test failed, the tail of every sandbox VM's console under dir: a
// guest that did not come up says why there.
func DumpConsolesOnFailure(tb testing.TB, dir string, lines int) {
	tb.Cleanup(func() {
		if !tb.Failed() {
			return
		}
		logs, _ := filepath.Glob(filepath.Join(dir, "vms", "*", "console.log"))
		for _, l := range logs {
			if b, err := os.ReadFile(l); err == nil {
				tb.Logf("%s (tail):\n%s", l, LastLines(string(b), lines))
			}
		}
	})
}

// WriteShimConfig writes the shim's default config file with its state under dir.
func WriteShimConfig(tb testing.TB, dir string) {
	if err := os.MkdirAll("/etc/cube", 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile("/etc/cube/shim.toml", fmt.Appendf(nil, ShimConfig, CubeVMM, GuestKernel, GuestInitrd, dir), 0o644); err != nil {
		tb.Fatal(err)
	}
}

// StartSnapshotter starts cube-snapshotter with its root under dir, serving on sock; a cleanup stops it.
func StartSnapshotter(tb testing.TB, dir string, env []string, sock string) {
	snapConf := filepath.Join(dir, "snap.toml")
	os.WriteFile(snapConf, fmt.Appendf(nil, "root = %q\naddress = %q\n[image]\ndefault_size = \"64MiB\"\n", dir+"/snaproot", sock), 0o644)
	snapLog, _ := os.Create(filepath.Join(dir, "snap.log"))
	snap := exec.Command(SnapshotterBin, "--config", snapConf)
	snap.Env, snap.Stdout, snap.Stderr = env, snapLog, snapLog
	if err := snap.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { Stop(tb, snap, filepath.Join(dir, "snap.log")) })
}

// Ctr runs Ctr against the daemon; a non-zero exit is rc, not an error.
func (d *Daemons) Ctr(args ...string) (string, int, error) {
	out, rc, err := d.CtrQuiet(nil, args...)
	if _, ok := d.tb.(*testing.T); ok {
		d.tb.Logf("ctr %s:\n%s", strings.Join(args, " "), out)
	}
	return out, rc, err
}

// CtrQuiet is ctr with stdin and without logging (for polls).
func (d *Daemons) CtrQuiet(stdin io.Reader, args ...string) (string, int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := d.CtrCmd(ctx, args...)
	cmd.Stdin = stdin
	// If ctr is killed at the deadline but something still holds its output, give up on the output rather
	// than hang the test.
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode(), nil
	}
	return string(out), 0, err
}

func (d *Daemons) CtrCmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, CtrBin, append([]string{"--address", d.Dir + "/containerd.sock", "--namespace", "e2e"}, args...)...)
	cmd.Env = d.Env
	return cmd
}

// Stop ends a daemon by pid and shows its log when the test failed.
func Stop(t testing.TB, cmd *exec.Cmd, logPath string) {
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		<-done
	}
	if t.Failed() {
		if b, err := os.ReadFile(logPath); err == nil {
			if len(b) > 30000 {
				b = b[len(b)-30000:]
			}
			t.Logf("%s (tail):\n%s", filepath.Base(logPath), b)
		}
	}
}

func LastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// StopStandbys stops the standby VMs the shims left under stateDir (a
// template restore leaves one for the next sandbox): they would outlive the
// test in the test host.
func StopStandbys(tb testing.TB, stateDir string) {
	n, err := standby.Stop(stateDir, "")
	if err != nil {
		tb.Errorf("stop standby VMs in %s: %v", stateDir, err)
	}
	if n > 0 {
		tb.Logf("stopped %d standby VM(s) in %s", n, stateDir)
	}
}
