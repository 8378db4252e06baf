package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"github.com/cube-runtime/cube/guest-agent/initsys"
	"github.com/cube-runtime/cube/guest-agent/protocol"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// buildAgent builds the static binary the guest image ships (a test binary
// is usually dynamically linked and could not run from the bare root).
func buildAgent(t *testing.T) []byte {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("needs the go tool to build the static agent binary")
	}
	out := filepath.Join(t.TempDir(), "cube-agent")
	cmd := exec.Command(goTool, "build", "-trimpath", "-o", out, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBootAsPID1 runs the agent as PID 1 of fresh pid, mount and network
// namespaces chrooted into a tmpfs, as the kernel runs /init from an
// initramfs: it must switch to a tmpfs root (so pivot_root works), mount the
// pseudo filesystems, bring up lo (down in a new network namespace, as in a
// fresh guest), serve, run a container in a network namespace of its own
// (whose lo it brings up too) and power off.
func TestBootAsPID1(t *testing.T) {
	// The simulated initramfs is a tmpfs mount, not the kernel's rootfs, so
	// pivot_root would work even without the switch; the move+chroot
	// fallback only shows in a real guest. noSwitch=true is kept for manual
	// experiments.
	bootAsPID1(t, false)
}

func bootAsPID1(t *testing.T, noSwitch bool) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates pid/mount/network namespaces and mounts a tmpfs")
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skipf("needs busybox-static at /bin/busybox: %v", err)
	}
	self := buildAgent(t)
	// The agent under test makes its container cgroups under /sys/fs/cgroup/cube of the machine's one cgroup2
	// hierarchy; remove them before (a crashed earlier run) and after.
	removeAgentCgroups(t)
	t.Cleanup(func() { removeAgentCgroups(t) })
	root := t.TempDir()
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "mode=0755"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(root, unix.MNT_DETACH)
	// Private, so nothing the guest mounts propagates back to the host.
	if err := unix.Mount("", root, "", unix.MS_PRIVATE, ""); err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(root, "init"), self, 0o755))
	must(os.MkdirAll(filepath.Join(root, "rootfs/bin"), 0o755))
	must(os.WriteFile(filepath.Join(root, "rootfs/bin/busybox"), bb, 0o755))
	for _, a := range []string{"sh", "cat", "hostname"} {
		must(os.Symlink("busybox", filepath.Join(root, "rootfs/bin", a)))
	}
	for _, d := range []string{"proc", "dev", "tmp"} {
		must(os.MkdirAll(filepath.Join(root, "rootfs", d), 0o755))
	}

	logf, err := os.Create(filepath.Join(t.TempDir(), "console.log"))
	must(err)
	defer logf.Close()
	// -debug: the per-container lines checked below are debug level (the shim logs their timings).
	cmd := exec.Command("/init", "-debug", "-agent-socket", "/agent.sock", "-stream-socket", "/stream.sock")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = []string{}
	if noSwitch {
		cmd.Env = []string{"CUBE_INIT_TMPFS_ROOT=1"}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWUTS | unix.CLONE_NEWNET,
		Chroot:     root,
	}
	must(cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	console := func() string { b, _ := os.ReadFile(logf.Name()); return string(b) }
	defer func() {
		if t.Failed() {
			t.Logf("guest console:\n%s", console())
		}
		cmd.Process.Kill()
	}()

	// The agent's sockets live in its new root, reachable from here through
	// /proc/<pid>/root.
	guest := fmt.Sprintf("/proc/%d/root", cmd.Process.Pid)
	var conn net.Conn
	deadline := time.Now().Add(time.Minute)
	for {
		conn, err = net.Dial("unix", guest+"/agent.sock")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent never listened: %v", err)
		}
		select {
		case err := <-exited:
			t.Fatalf("agent exited during boot: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	client := protocol.NewAgentClient(ttrpc.NewClient(conn))
	ctx := context.Background()

	// Boot did its mounts in the guest's namespace, not ours.
	mounts, err := os.ReadFile(fmt.Sprintf("/proc/%d/mounts", cmd.Process.Pid))
	must(err)
	for _, m := range []string{" /proc proc ", " /sys sysfs ", " /dev devtmpfs ", " /run tmpfs ", " /dev/pts devpts "} {
		if !strings.Contains(string(mounts), m) {
			t.Errorf("guest mounts lack %q:\n%s", m, mounts)
		}
	}
	// The guest's sysfs (mounted in its network namespace) shows its lo; "unknown" is lo's operstate when up.
	if b, err := os.ReadFile(guest + "/sys/class/net/lo/operstate"); err != nil || strings.TrimSpace(string(b)) == "down" {
		t.Errorf("guest lo operstate %q, %v: want up (unknown)", b, err)
	}
	if c := console(); !strings.Contains(c, "loopback up") {
		t.Errorf("console does not log lo brought up:\n%s", c)
	}
	// Every thread of the agent has its coarse timer slack (set once /proc is mounted).
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", cmd.Process.Pid))
	must(err)
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc", filepath.Base(task), "timerslack_ns"))
		if err != nil || strings.TrimSpace(string(b)) != fmt.Sprint(initsys.AgentTimerSlack) {
			t.Errorf("agent thread %s: timer slack %q (%v), want %d", filepath.Base(task), b, err, initsys.AgentTimerSlack)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "init")); os.IsNotExist(err) == noSwitch {
		t.Errorf("initramfs content moved: %v, want moved: %v", os.IsNotExist(err), !noSwitch)
	}

	spec := specs.Spec{
		Process:  &specs.Process{Args: []string{"sh", "-c", "hostname; cat /sys/class/net/lo/operstate /proc/self/timerslack_ns; exit 4"}, Cwd: "/", Env: []string{"PATH=/bin"}},
		Hostname: "in-guest",
		// sysfs mounted in the container's own network namespace shows that
		// namespace's lo; the process has Linux's default timer slack, not the agent's.
		Mounts: []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}, {Destination: "/sys", Type: "sysfs", Source: "sysfs"}},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.MountNamespace}, {Type: specs.PIDNamespace}, {Type: specs.UTSNamespace},
			{Type: specs.NetworkNamespace}}},
	}
	b, _ := json.Marshal(spec)
	if _, err := client.CreateContainer(ctx, &protocol.CreateContainerRequest{ContainerId: "c", Spec: b, Rootfs: "/rootfs", Stdio: &protocol.Stdio{Stdout: true}}); err != nil {
		t.Fatalf("create container under a PID-1 agent: %v", err)
	}
	sc, err := net.Dial("unix", guest+"/stream.sock")
	must(err)
	defer sc.Close()
	must(protocol.OpenStream(sc, protocol.StreamHeader{ContainerID: "c", Stream: protocol.Stdout}))
	if _, err := client.Start(ctx, &protocol.StartRequest{ContainerId: "c"}); err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(sc)
	w, err := client.Wait(ctx, &protocol.WaitRequest{ContainerId: "c"})
	if err != nil || w.ExitStatus != 4 || string(out) != "in-guest\nunknown\n50000\n" {
		t.Fatalf("container: out %q, wait %v %v", out, w, err)
	}
	if _, err := client.Delete(ctx, &protocol.DeleteRequest{ContainerId: "c"}); err != nil {
		t.Errorf("delete container: %v", err)
	}
	if c := console(); !strings.Contains(c, " lo=up ") || !strings.Contains(c, " netns=new ") {
		t.Errorf("console does not log the container's own network namespace with lo up:\n%s", c)
	}
	want := "root_switch=pivot_root"
	if noSwitch {
		want = "root_switch=move+chroot"
	}
	if c := console(); !strings.Contains(c, want) {
		t.Errorf("console lacks %q:\n%s", want, c)
	}

	// Power-off: in a pid namespace, reboot(POWER_OFF) kills its init with SIGINT.
	if _, err := client.PowerOff(ctx, &protocol.PowerOffRequest{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
		if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGINT {
			t.Fatalf("agent ended with %v, want killed by SIGINT (pid-namespace power off)", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("agent did not power off")
	}
}

// removeAgentCgroups removes the cgroup2 directories the default agent configuration creates.
func removeAgentCgroups(t *testing.T) {
	mnt := t.TempDir()
	if err := unix.Mount("cgroup2", mnt, "cgroup2", 0, ""); err != nil {
		return // no cgroup2 here: the agent made none either
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	dirs, _ := filepath.Glob(filepath.Join(mnt, "cube", "*"))
	for _, d := range dirs {
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			unix.Rmdir(d)
		}
	}
	unix.Rmdir(filepath.Join(mnt, "cube"))
}
