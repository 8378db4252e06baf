package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cube-runtime/cube/guest-agent/protocol"
	"github.com/cube-runtime/cube/hypervisor/vsockdial"
	"github.com/cube-runtime/cube/integration/benchloss"
	"github.com/cube-runtime/cube/integration/sandboxenv"
	"github.com/cube-runtime/cube/integration/vmmrun"
)

// sandbox is a booted guest with a ttrpc client to its agent.
type sandbox struct {
	t      testing.TB
	vmm    *vmmrun.Process
	uds    string
	client protocol.AgentService
	ready  time.Duration // cube-vmm start to the agent answering Version
}

// boot starts cube-vmm on the guest image with a private copy of the rootfs disk and waits for the agent.
func boot(t testing.TB) *sandbox {
	t.Helper()
	s, err := bootErr(t)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// bootErr is boot returning the agent's failure to answer, classified (benchloss): a cube-vmm that exited
// says by its status whether the nested guest was lost (10: it reset), and no answer in 3 minutes is a stall;
// either way cube-vmm is killed. Preparing the disk or starting cube-vmm fails t.
func bootErr(t testing.TB) (*sandbox, error) {
	t.Helper()
	dir := t.TempDir()
	disk := filepath.Join(dir, "rootfs.img")
	b, err := os.ReadFile(rootfsImage)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(disk, b, 0o644); err != nil {
		t.Fatal(err)
	}
	s := &sandbox{t: t, uds: filepath.Join(dir, "vsock.sock")}
	start := time.Now()
	s.vmm = vmmrun.Start(t, cubeVMM, "-kernel", guestKernel, "-initrd", guestInitrd, "-memory", "256",
		"-cmdline", "console=ttyS0 panic=-1 quiet", "-vsock", s.uds, "-disk", disk+",serial=rootfs0")
	// The agent listens once its modules are loaded; until then CONNECT is refused.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := vsockdial.Dial(ctx, s.uds, protocol.AgentPort)
		if err == nil {
			c := protocol.NewAgentClient(ttrpc.NewClient(conn))
			if _, err = c.Version(ctx, &protocol.VersionRequest{}); err == nil {
				cancel()
				s.client = c
				s.ready = time.Since(start)
				return s, nil
			}
			conn.Close()
		}
		cancel()
		if code, exited := s.vmm.Exited(); exited {
			return nil, benchloss.ExitedStatus(code, benchloss.CubeVMMReset, fmt.Errorf("cube-vmm exited (status %d) before the agent answered: %v\nconsole:\n%s\nstderr:\n%s",
				code, err, s.vmm.ConsoleTail(), s.vmm.Stderr()))
		}
		if time.Now().After(deadline) {
			s.vmm.Kill()
			return nil, benchloss.Stalled(fmt.Errorf("agent never answered in 3m: %v\nconsole:\n%s\nstderr:\n%s", err, s.vmm.ConsoleTail(), s.vmm.Stderr()))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *sandbox) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	s.t.Cleanup(cancel)
	return ctx
}

// stream opens one stdio stream of a process (before Start, so no output is lost).
func (s *sandbox) stream(id, exec string, which protocol.Stream) io.ReadWriteCloser {
	s.t.Helper()
	conn, err := vsockdial.Dial(s.ctx(), s.uds, protocol.StreamPort)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := protocol.OpenStream(conn, protocol.StreamHeader{ContainerID: id, ExecID: exec, Stream: which}); err != nil {
		conn.Close()
		s.t.Fatalf("open %v stream of %s/%s: %v", which, id, exec, err)
	}
	s.t.Cleanup(func() { conn.Close() })
	return conn
}

func spec(args ...string) []byte {
	b, _ := json.Marshal(specOf(args...))
	return b
}

func specOf(args ...string) *specs.Spec {
	return &specs.Spec{
		Version:  specs.Version,
		Process:  &specs.Process{Args: args, Cwd: "/", Env: []string{"PATH=/bin"}},
		Hostname: "cube-e2e",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs"},
		},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
			{Type: specs.MountNamespace}, {Type: specs.PIDNamespace}, {Type: specs.UTSNamespace}, {Type: specs.IPCNamespace},
		}},
	}
}

// loopbackScript prints lo's operstate ("unknown" when up: lo has no carrier to report), serves a file over
// HTTP on 127.0.0.1 (busybox httpd, which backgrounds itself) and fetches it from the same container. With lo
// down, the server listens but wget gets "Network is unreachable" (its stderr goes to stdout, to be seen).
const loopbackScript = `cat /sys/class/net/lo/operstate
busybox mkdir -p /tmp/www && echo hello-over-loopback > /tmp/www/hi
busybox httpd -p 127.0.0.1:8080 -h /tmp/www || exit 2
for i in 1 2 3 4 5 6 7 8 9 10; do busybox wget -q -O - http://127.0.0.1:8080/hi 2>&1 && exit 0; sleep 1; done
exit 1`

// checkLoopback runs loopbackScript in container id, in the guest's network namespace or (newNetns) in one the
// agent creates for it, and checks lo is up and a client reaches the server on 127.0.0.1.
func (s *sandbox) checkLoopback(id, rootfs string, newNetns bool) {
	s.t.Helper()
	sp := specOf("sh", "-c", loopbackScript)
	// sysfs mounted in the container's network namespace shows that namespace's lo.
	sp.Mounts = append(sp.Mounts, specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs"})
	where := "the guest's network namespace"
	if newNetns {
		sp.Linux.Namespaces = append(sp.Linux.Namespaces, specs.LinuxNamespace{Type: specs.NetworkNamespace})
		where = "a network namespace of its own"
	}
	b, _ := json.Marshal(sp)
	if _, err := s.client.CreateContainer(s.ctx(), &protocol.CreateContainerRequest{ContainerId: id, Rootfs: rootfs, Spec: b,
		Stdio: &protocol.Stdio{Stdout: true}}); err != nil {
		s.t.Fatalf("create %s (%s): %v", id, where, err)
	}
	out := s.stream(id, "", protocol.Stdout)
	if _, err := s.client.Start(s.ctx(), &protocol.StartRequest{ContainerId: id}); err != nil {
		s.t.Fatalf("start %s: %v", id, err)
	}
	got, _ := io.ReadAll(out)
	w, err := s.client.Wait(s.ctx(), &protocol.WaitRequest{ContainerId: id})
	if want := "unknown\nhello-over-loopback\n"; err != nil || w.ExitStatus != 0 || string(got) != want {
		s.t.Errorf("loopback in %s (%s): output %q, wait %+v %v; want %q, exit 0 (lo up, 127.0.0.1 answers)", id, where, got, w, err, want)
	} else {
		s.t.Logf("container %q (%s): lo up, HTTP over 127.0.0.1 answered", id, where)
	}
	if _, err := s.client.Delete(s.ctx(), &protocol.DeleteRequest{ContainerId: id}); err != nil {
		s.t.Errorf("delete %s: %v", id, err)
	}
}

// TestContainerInGuest: boot the guest image, mount the rootfs disk by serial, run a container (output,
// exit code), check loopback (lo up, an HTTP server and client on 127.0.0.1 in one container, both in the
// guest's network namespace and in one the agent creates), exec into another container, kill it, and power
// the VM off cleanly.
func TestContainerInGuest(t *testing.T) {
	s := boot(t)
	t.Logf("cube-vmm start to agent answering: %v", s.ready)
	v, err := s.client.Version(s.ctx(), &protocol.VersionRequest{})
	if err != nil || !strings.HasPrefix(v.KernelRelease, "6.1.") {
		t.Fatalf("version = %+v, %v", v, err)
	}
	md, err := s.client.MountDisk(s.ctx(), &protocol.MountDiskRequest{Serial: "rootfs0"})
	if err != nil {
		t.Fatalf("mount rootfs disk: %v", err)
	}
	if _, err := s.client.MountDisk(s.ctx(), &protocol.MountDiskRequest{Serial: "nosuchdisk"}); err == nil {
		t.Error("mounting a disk that does not exist succeeded")
	}

	// A container's output and exit code.
	if _, err := s.client.CreateContainer(s.ctx(), &protocol.CreateContainerRequest{ContainerId: "one", Rootfs: md.MountPoint,
		Spec: spec("sh", "-c", "cat /etc/motd; hostname; echo pid=$$; exit 3"), Stdio: &protocol.Stdio{Stdout: true}}); err != nil {
		t.Fatalf("create: %v", err)
	}
	out := s.stream("one", "", protocol.Stdout)
	if _, err := s.client.Start(s.ctx(), &protocol.StartRequest{ContainerId: "one"}); err != nil {
		t.Fatalf("start: %v", err)
	}
	got, _ := io.ReadAll(out)
	if want := sandboxenv.Motd + "cube-e2e\npid=1\n"; string(got) != want {
		t.Errorf("output = %q, want %q", got, want)
	}
	w, err := s.client.Wait(s.ctx(), &protocol.WaitRequest{ContainerId: "one"})
	if err != nil || w.ExitStatus != 3 {
		t.Fatalf("wait = %+v, %v; want exit 3", w, err)
	}
	t.Logf("guest kernel %s, agent %s; rootfs disk %s mounted at %s", v.KernelRelease, v.AgentVersion, md.Device, md.MountPoint)
	t.Logf("container \"one\" printed %q and exited %d", got, w.ExitStatus)
	if _, err := s.client.Delete(s.ctx(), &protocol.DeleteRequest{ContainerId: "one"}); err != nil {
		t.Errorf("delete: %v", err)
	}

	// Loopback: the agent, as /init, brought lo up at boot, and brings it up in each network namespace it makes.
	s.checkLoopback("lo-guest", md.MountPoint, false)
	s.checkLoopback("lo-own", md.MountPoint, true)

	// A long-running container, an exec into it, then SIGTERM.
	if _, err := s.client.CreateContainer(s.ctx(), &protocol.CreateContainerRequest{ContainerId: "two", Rootfs: md.MountPoint,
		Spec: spec("sleep", "1000")}); err != nil {
		t.Fatalf("create two: %v", err)
	}
	if _, err := s.client.Start(s.ctx(), &protocol.StartRequest{ContainerId: "two"}); err != nil {
		t.Fatalf("start two: %v", err)
	}
	proc, _ := json.Marshal(&specs.Process{Args: []string{"sh", "-c", "echo exec-sees $(hostname)"}, Cwd: "/", Env: []string{"PATH=/bin"}})
	if _, err := s.client.ExecProcess(s.ctx(), &protocol.ExecProcessRequest{ContainerId: "two", ExecId: "e1", Process: proc, Stdio: &protocol.Stdio{Stdout: true}}); err != nil {
		t.Fatalf("exec: %v", err)
	}
	eout := s.stream("two", "e1", protocol.Stdout)
	if _, err := s.client.Start(s.ctx(), &protocol.StartRequest{ContainerId: "two", ExecId: "e1"}); err != nil {
		t.Fatalf("start exec: %v", err)
	}
	if got, _ := io.ReadAll(eout); string(got) != "exec-sees cube-e2e\n" {
		t.Errorf("exec output = %q", got)
	} else {
		t.Logf("exec into container \"two\" printed %q", got)
	}
	if w, err := s.client.Wait(s.ctx(), &protocol.WaitRequest{ContainerId: "two", ExecId: "e1"}); err != nil || w.ExitStatus != 0 {
		t.Errorf("exec wait = %+v, %v", w, err)
	}
	pids, err := s.client.ListPids(s.ctx(), &protocol.ListPidsRequest{ContainerId: "two"})
	if err != nil || len(pids.Pids) == 0 {
		t.Errorf("list pids = %v, %v", pids, err)
	}
	// SIGKILL: sleep is PID 1 of its pid namespace, which ignores SIGTERM without a handler (as under runc).
	if _, err := s.client.Signal(s.ctx(), &protocol.SignalRequest{ContainerId: "two", Signal: uint32(syscall.SIGKILL)}); err != nil {
		t.Fatalf("signal: %v", err)
	}
	w, err = s.client.Wait(s.ctx(), &protocol.WaitRequest{ContainerId: "two"})
	if err != nil || w.Signal != uint32(syscall.SIGKILL) || w.ExitStatus != 128+uint32(syscall.SIGKILL) {
		t.Errorf("wait after SIGKILL = %+v, %v; want signal 9, status 137", w, err)
	} else {
		t.Logf("container \"two\" (pids %v) killed: status %d", pids.Pids, w.ExitStatus)
	}
	if _, err := s.client.Signal(s.ctx(), &protocol.SignalRequest{ContainerId: "nosuch", Signal: 9}); err == nil {
		t.Error("signal to an unknown container succeeded")
	}

	// Clean power-off: cube-vmm exits 0.
	if _, err := s.client.PowerOff(s.ctx(), &protocol.PowerOffRequest{}); err != nil && !strings.Contains(err.Error(), "closed") {
		t.Errorf("power off: %v", err)
	}
	if st := s.vmm.Wait(t, 2*time.Minute); st != 0 {
		t.Fatalf("cube-vmm exit %d after power-off, want 0; stderr:\n%s", st, s.vmm.Stderr())
	}
	t.Log("guest powered off; cube-vmm exited 0")
}

// BenchmarkAgentReady: cube-vmm start to the agent answering Version, over 5 boots (test host); reports the
// median. A boot whose nested guest is lost (cube-vmm exits 10, the agent never answers) is taken again with a
// fresh VM, counted and left out of the median (benchloss).
func BenchmarkAgentReady(b *testing.B) {
	loss := benchloss.New(b)
	var ds []time.Duration
	loss.Run(b, 5, "boot", func(int) error {
		s, err := bootErr(b)
		if err != nil {
			return err
		}
		ds = append(ds, s.ready)
		s.client.PowerOff(s.ctx(), &protocol.PowerOffRequest{})
		_, err = s.vmm.WaitErr(2 * time.Minute)
		if err != nil {
			s.vmm.Kill()
		}
		// The agent answered: the sample counts, and a VM lost as it powers off is counted beside it.
		return loss.Lost("power off", benchloss.Stalled(err))
	})
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	var m time.Duration
	if len(ds) > 0 {
		m = ds[len(ds)/2]
	}
	b.ReportMetric(float64(m.Milliseconds()), "ms-to-agent")
	b.Logf("cube-vmm start to agent answering: %v (median %v)", ds, m)
	fmt.Printf("\ncube-vmm start to agent answering: median %v of %d boots\n", m, len(ds))
	loss.Check(b)
}
