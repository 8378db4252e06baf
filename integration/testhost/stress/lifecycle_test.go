package stress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cube-runtime/cube/guest-agent/protocol"
	"github.com/cube-runtime/cube/hypervisor/control"
	"github.com/cube-runtime/cube/hypervisor/vsockdial"
	"github.com/cube-runtime/cube/integration/sandboxenv"
	"github.com/cube-runtime/cube/integration/testhost"
	"github.com/cube-runtime/cube/integration/vmmrun"
)

// Lifecycle results, as the STRESS lines name them. Only "ok" is a lifecycle that went through.
const (
	resultOK          = "ok"
	resultTripleFault = "triple-fault"  // cube-vmm exited 10: the nested guest reset itself
	resultBootStall   = "boot-stall"    // the agent never answered after boot
	resultStall       = "stall"         // the agent stopped answering later (after the rollback, or mid-call)
	resultVMMExit     = "vmm-exit"      // cube-vmm ended on its own with another status
	resultError       = "error"         // a call failed with an error (snapshot, rollback, container)
	resultKillHang    = "kill-hang"     // cube-vmm did not exit within a minute of SIGKILL
	resultKernel      = "kernel-failed" // host side only: the test host's kernel died during this lifecycle
)

// stressLine is the one line a lifecycle prints; the host side parses it.
type stressLine struct {
	N       int    `json:"n"`
	Result  string `json:"result"`
	BootMS  int64  `json:"boot_ms,omitempty"`
	TotalMS int64  `json:"total_ms"`
	Detail  string `json:"detail,omitempty"`
}

const linePrefix = "STRESS "

// TestLifecycles runs CUBE_STRESS_COUNT nested VM lifecycles (numbered from CUBE_STRESS_FIRST), each: boot
// the guest image with CUBE_STRESS_VCPUS vCPUs (default 2), start a container running the workload through the agent, take a full snapshot, roll back to
// it, SIGKILL cube-vmm while its vCPUs are in KVM_RUN. A failed lifecycle is a measurement, not a test
// failure: it prints its result and the next one starts.
func TestLifecycles(t *testing.T) {
	if !testhost.Inside() {
		t.Skipf("the lifecycles run inside a test host that the package's TestMain boots when %s is set", envLifecycles)
	}
	count, err := strconv.Atoi(os.Getenv(envCount))
	if err != nil || count < 1 {
		t.Fatalf("%s=%q: want the number of lifecycles (the host side sets it)", envCount, os.Getenv(envCount))
	}
	first, _ := strconv.Atoi(os.Getenv(envFirst))
	if os.Getenv(envLoad) == "1" {
		// On the root disk (ext4 on virtio-blk), not the tmpfs /tmp.
		stop := startLoad("/cube/work")
		defer stop()
	}
	for n := first; n < first+count; n++ {
		var l stressLine
		t.Run(fmt.Sprintf("lifecycle-%d", n), func(t *testing.T) { l = lifecycle(t, n) })
		b, _ := json.Marshal(l)
		fmt.Printf("%s%s\n", linePrefix, b)
	}
}

// failure is a lifecycle that ended early, with its result class.
type failure struct {
	result string
	err    error
}

func (f *failure) Error() string { return f.result + ": " + f.err.Error() }

func fail(result string, format string, a ...any) error {
	return &failure{result: result, err: fmt.Errorf(format, a...)}
}

func lifecycle(t *testing.T, n int) stressLine {
	start := time.Now()
	l := stressLine{N: n, Result: resultOK}
	boot, err := runLifecycle(t)
	l.BootMS = boot.Milliseconds()
	l.TotalMS = time.Since(start).Milliseconds()
	if err != nil {
		var f *failure
		if errors.As(err, &f) {
			l.Result = f.result
		} else {
			l.Result = resultError
		}
		l.Detail = err.Error()
		if len(l.Detail) > 300 {
			l.Detail = l.Detail[:300]
		}
		t.Logf("lifecycle %d: %v", n, err)
	}
	return l
}

// vmmGone classifies cube-vmm having ended: exit 10 is the guest's triple fault / reset.
func vmmGone(vmm *vmmrun.Process, what string) error {
	st, ok := vmm.Exited()
	if !ok {
		return nil
	}
	if st == 10 {
		return fail(resultTripleFault, "%s: cube-vmm exited 10 (guest reset); console:\n%s", what, vmm.ConsoleTail())
	}
	return fail(resultVMMExit, "%s: cube-vmm exited %d; stderr:\n%s", what, st, vmm.Stderr())
}

// dialAgent waits until the agent answers Version, classifying why it does not.
func dialAgent(vmm *vmmrun.Process, uds string, timeout time.Duration, stall string) (*ttrpc.Client, protocol.AgentService, error) {
	deadline := time.Now().Add(timeout)
	for {
		if err := vmmGone(vmm, "waiting for the agent"); err != nil {
			return nil, nil, err
		}
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := vsockdial.Dial(c, uds, protocol.AgentPort)
		if err == nil {
			tc := ttrpc.NewClient(conn)
			cl := protocol.NewAgentClient(tc)
			if _, err = cl.Version(c, &protocol.VersionRequest{}); err == nil {
				cancel()
				return tc, cl, nil
			}
			tc.Close()
		}
		cancel()
		if time.Now().After(deadline) {
			return nil, nil, fail(stall, "agent silent for %v (%v); console:\n%s", timeout, err, vmm.ConsoleTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Guest workloads (CUBE_STRESS_WORKLOAD): what the container runs while the lifecycle snapshots, rolls back
// and kills. "forks" (the default) forks /bin/true in two loops, one per guest vCPU: every fork and exit
// makes the guest's vCPUs send each other IPIs and TLB shootdowns, each a VM exit on which the test host's KVM
// kicks the other vCPU's thread with a reschedule IPI while that thread is inside KVM_RUN (the interrupt
// seen in the kernel failures). "busy" is one shell loop of arithmetic: a vCPU in KVM_RUN with few exits.
const envWorkload = "CUBE_STRESS_WORKLOAD"

var workloads = map[string]string{
	"forks": "while :; do /bin/true; done & while :; do /bin/true; done",
	"busy":  "i=0; while :; do i=$((i+1)); [ $((i % 1000)) = 0 ] && echo $i >/tmp/n; done",
}

// envVCPUs is the nested guest's vCPU count (CUBE_STRESS_VCPUS, 1 or 2; default 2). With 1 the guest sends
// no IPIs between its vCPUs: what is left is the test host's own activity (the shim's sandboxes have 1 vCPU).
const envVCPUs = "CUBE_STRESS_VCPUS"

// guestVCPUs is CUBE_STRESS_VCPUS, checked.
func guestVCPUs() (string, error) {
	switch v := os.Getenv(envVCPUs); v {
	case "":
		return "2", nil
	case "1", "2":
		return v, nil
	default:
		return "", fmt.Errorf("%s=%q: want 1 or 2 (the nested guest's vCPUs)", envVCPUs, v)
	}
}

// workloadName is CUBE_STRESS_WORKLOAD, checked; "" means the default.
func workloadName() (string, error) {
	w := os.Getenv(envWorkload)
	if w == "" {
		return "forks", nil
	}
	if _, ok := workloads[w]; !ok {
		return "", fmt.Errorf("%s=%q: want forks or busy", envWorkload, w)
	}
	return w, nil
}

// workloadSpec is the container running the workload.
func workloadSpec(w string) []byte {
	b, _ := json.Marshal(&specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{Args: []string{"sh", "-c", workloads[w]}, Cwd: "/", Env: []string{"PATH=/bin"}},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs"},
		},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.MountNamespace}, {Type: specs.PIDNamespace}}},
	})
	return b
}

func callCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), time.Minute)
}

// runLifecycle is one lifecycle; it returns the boot time (cube-vmm start to the agent answering).
func runLifecycle(t *testing.T) (time.Duration, error) {
	w, err := workloadName()
	if err != nil {
		return 0, err
	}
	vcpus, err := guestVCPUs()
	if err != nil {
		return 0, err
	}
	dir := t.TempDir()
	uds, ctlSock, disk := filepath.Join(dir, "vsock.sock"), filepath.Join(dir, "ctl.sock"), filepath.Join(dir, "rootfs.img")
	img, err := os.ReadFile(sandboxenv.RootfsImage)
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(disk, img, 0o644); err != nil {
		return 0, err
	}
	start := time.Now()
	vmm := vmmrun.Start(t, sandboxenv.CubeVMM, "-kernel", sandboxenv.GuestKernel, "-initrd", sandboxenv.GuestInitrd,
		"-memory", "256", "-vcpus", vcpus, "-cmdline", "console=ttyS0 panic=-1 quiet", "-vsock", uds,
		"-disk", disk+",serial=rootfs0", "-control", ctlSock)
	tc, cl, err := dialAgent(vmm, uds, 2*time.Minute, resultBootStall)
	if err != nil {
		return 0, err
	}
	boot := time.Since(start)
	defer func() { tc.Close() }()
	// call wraps an agent or control call: an error while cube-vmm is gone is classified by how it went.
	call := func(what string, f func(context.Context) error) error {
		c, cancel := callCtx()
		defer cancel()
		err := f(c)
		if err == nil {
			return nil
		}
		// A closed connection is often cube-vmm on its way out (a guest reset): give it a moment to be reaped
		// before classifying, and keep its last words for the log.
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if _, ok := vmm.Exited(); ok {
				break
			}
		}
		t.Logf("%s failed: %v\nconsole:\n%s\nstderr (tail):\n%s", what, err, vmm.ConsoleTail(), testhost.TailLines([]byte(vmm.Stderr()), 20))
		if gone := vmmGone(vmm, what); gone != nil {
			return gone
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return fail(resultStall, "%s: no answer within a minute; console:\n%s", what, vmm.ConsoleTail())
		}
		return fail(resultError, "%s: %v", what, err)
	}
	var md *protocol.MountDiskResponse
	if err := call("mount the rootfs disk", func(c context.Context) (err error) {
		md, err = cl.MountDisk(c, &protocol.MountDiskRequest{Serial: "rootfs0"})
		return err
	}); err != nil {
		return boot, err
	}
	if err := call("create the container", func(c context.Context) error {
		_, err := cl.CreateContainer(c, &protocol.CreateContainerRequest{ContainerId: "busy", Rootfs: md.MountPoint, Spec: workloadSpec(w)})
		return err
	}); err != nil {
		return boot, err
	}
	if err := call("start the container", func(c context.Context) error {
		_, err := cl.Start(c, &protocol.StartRequest{ContainerId: "busy"})
		return err
	}); err != nil {
		return boot, err
	}
	time.Sleep(300 * time.Millisecond)
	ctl, err := control.Dial(context.Background(), ctlSock)
	if err != nil {
		return boot, fail(resultError, "control socket: %v", err)
	}
	defer ctl.Close()
	snap := filepath.Join(dir, "snap")
	// Not bounded by call's context, as before the control client took one: under TCG a snapshot's time is not
	// known to stay under its minute.
	if err := call("snapshot", func(context.Context) error { _, err := ctl.Snapshot(context.Background(), snap, false); return err }); err != nil {
		return boot, err
	}
	time.Sleep(300 * time.Millisecond)
	if err := call("rollback", func(context.Context) error { _, err := ctl.Rollback(context.Background(), snap); return err }); err != nil {
		return boot, err
	}
	// The guest saw a transport reset: a new connection, and the container must still run.
	tc.Close()
	if tc, cl, err = dialAgent(vmm, uds, time.Minute, resultStall); err != nil {
		return boot, err
	}
	var pids *protocol.ListPidsResponse
	if err := call("list the container's pids after the rollback", func(c context.Context) (err error) {
		pids, err = cl.ListPids(c, &protocol.ListPidsRequest{ContainerId: "busy"})
		return err
	}); err != nil {
		return boot, err
	}
	if len(pids.Pids) == 0 {
		return boot, fail(resultError, "the busy container has no process after the rollback")
	}
	time.Sleep(300 * time.Millisecond)
	if err := vmmGone(vmm, "before the kill"); err != nil {
		return boot, err
	}
	// SIGKILL while a vCPU runs the busy loop (inside KVM_RUN): the path the test host's kernel died on most.
	if err := vmm.Kill(); err != nil {
		return boot, fail(resultError, "kill cube-vmm: %v", err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if _, ok := vmm.Exited(); ok {
			break
		}
		if time.Now().After(deadline) {
			return boot, fail(resultKillHang, "cube-vmm still there a minute after SIGKILL")
		}
	}
	return boot, nil
}
