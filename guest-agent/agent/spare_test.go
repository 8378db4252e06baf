package agent

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/guest-agent/protocol"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
)

// withNetns is testSpec's container with a network namespace of its own:
// the namespaces containerd's default spec gives (a spare's default).
func withNetns(s *specs.Spec) *specs.Spec {
	s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.NetworkNamespace})
	return s
}

func (h *harness) prepareSpare() *protocol.PrepareSpareResponse {
	h.t.Helper()
	r, err := h.client.PrepareSpare(context.Background(), &protocol.PrepareSpareRequest{})
	if err != nil || r.Pid == 0 {
		h.t.Fatalf("PrepareSpare: %v %v", r, err)
	}
	return r
}

func gone(pid uint32) bool {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if unix.Kill(int(pid), 0) == unix.ESRCH {
			return true
		}
	}
	return false
}

func TestSpareHelperTakesTheFirstFittingCreate(t *testing.T) {
	needRoot(t)
	h := newHarness(t, nil)
	sp := h.prepareSpare()
	// The rootfs is mounted after the spare was made, as a restored
	// template's rootfs disk is: the spare must see it.
	root := t.TempDir()
	if err := unix.Mount(makeRootfs(t), root, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	if !strings.Contains(sp.Timing, "fork=") || !strings.Contains(sp.Timing, "lo=") {
		t.Errorf("spare timing %q: want its fork and lo steps", sp.Timing)
	}
	if again := h.prepareSpare(); again.Pid != sp.Pid || again.Timing != "" {
		t.Errorf("second PrepareSpare = %v, want the parked spare %d again", again, sp.Pid)
	}

	// stdin, stdout and stderr all travel in the handoff; the container is
	// in its pid namespace, its cgroup, with lo up in its own network namespace.
	spec := withNetns(testSpec(root, "sh", "-c", "cat; echo pid=$$; hostname; grep -c spare1 /proc/self/cgroup; grep -c 'lo:' /proc/net/dev; echo err >&2; exit 5"))
	timing := h.create("spare1", spec, &protocol.Stdio{Stdin: true, Stdout: true, Stderr: true})
	if !strings.Contains(timing, "spare=1") || strings.Contains(timing, "fork=") {
		t.Errorf("create timing %q: want the spare taken (spare=1), no fork", timing)
	}
	in := h.stream("spare1", "", protocol.Stdin)
	out := h.stream("spare1", "", protocol.Stdout)
	errs := h.stream("spare1", "", protocol.Stderr)
	h.start("spare1", "")
	io.WriteString(in, "from stdin\n")
	in.(interface{ CloseWrite() error }).CloseWrite()
	wantCgroup := "1\n"
	if h.svc.cfg.CgroupRoot == "-" {
		wantCgroup = "0\n"
	}
	if got, want := readAll(t, out), "from stdin\npid=1\ncube-test\n"+wantCgroup+"1\n"; got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
	if got := readAll(t, errs); got != "err\n" {
		t.Errorf("stderr %q", got)
	}
	if w := h.wait("spare1", ""); w.ExitStatus != 5 {
		t.Errorf("exit %d, want 5", w.ExitStatus)
	}

	// Used up: the next create forks its helper.
	if timing := h.create("forked", withNetns(testSpec(root, "true")), nil); strings.Contains(timing, "spare=1") || !strings.Contains(timing, "fork=") {
		t.Errorf("second create timing %q: want a forked helper", timing)
	}
}

func TestSpareHelperDiscardedByAnotherShape(t *testing.T) {
	needRoot(t)
	h := newHarness(t, nil)
	root := makeRootfs(t)
	sp := h.prepareSpare()
	// No network namespace: not the spare's namespaces.
	if timing := h.create("nonet", testSpec(root, "true"), nil); strings.Contains(timing, "spare=1") {
		t.Errorf("create timing %q: the spare does not fit and must not be taken", timing)
	}
	if !gone(sp.Pid) {
		t.Errorf("spare %d still runs after a create it did not fit", sp.Pid)
	}
	// A fresh one serves the next fitting create.
	if sp2 := h.prepareSpare(); sp2.Pid == sp.Pid {
		t.Errorf("PrepareSpare after the discard returned the old pid %d", sp.Pid)
	}
	if timing := h.create("net", withNetns(testSpec(root, "true")), nil); !strings.Contains(timing, "spare=1") {
		t.Errorf("create timing %q: want the new spare taken", timing)
	}
}

func TestSpareHelperWithTerminalAndBadSpec(t *testing.T) {
	needRoot(t)
	h := newHarness(t, nil)
	root := makeRootfs(t)
	sp := h.prepareSpare()
	// A spec the helper refuses: the error is the helper's, and the spare is used up.
	bad := withNetns(testSpec(root, "no-such-command"))
	_, err := h.client.CreateContainer(context.Background(), &protocol.CreateContainerRequest{ContainerId: "bad", Spec: specJSON(t, bad)})
	wantCode(t, err, codes.NotFound, `executable "no-such-command" not found`)
	if !gone(sp.Pid) {
		t.Errorf("spare %d still runs after its create failed", sp.Pid)
	}

	h.prepareSpare()
	spec := withNetns(testSpec(root, "sh", "-c", "tty; exit 7"))
	spec.Process.Terminal = true
	if timing := h.create("tty", spec, &protocol.Stdio{Stdout: true}); !strings.Contains(timing, "spare=1") {
		t.Errorf("create timing %q: want the spare taken", timing)
	}
	out := h.stream("tty", "", protocol.Stdout)
	h.start("tty", "")
	if got := readAll(t, out); !strings.Contains(got, "/dev/pts/0") {
		t.Errorf("terminal output %q, want /dev/pts/0 (the container's devpts)", got)
	}
	if w := h.wait("tty", ""); w.ExitStatus != 7 {
		t.Errorf("exit %d, want 7", w.ExitStatus)
	}
}

func openFds(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// Spares and forked helpers, used, discarded or failed, leave none of the
// agent's file descriptors open.
func TestSpareAndHelpersLeaveNoFds(t *testing.T) {
	needRoot(t)
	h := newHarness(t, nil)
	root := makeRootfs(t)
	run := func(id string, spec *specs.Spec) {
		t.Helper()
		h.create(id, spec, nil)
		h.start(id, "")
		h.wait(id, "")
		if _, err := h.client.Delete(context.Background(), &protocol.DeleteRequest{ContainerId: id}); err != nil {
			t.Fatal(err)
		}
	}
	run("warm", withNetns(testSpec(root, "true"))) // the harness's own connections settle
	before := openFds(t)
	h.prepareSpare()
	run("taken", withNetns(testSpec(root, "true")))
	h.prepareSpare()
	run("discarding", testSpec(root, "true"))
	h.prepareSpare()
	_, err := h.client.CreateContainer(context.Background(), &protocol.CreateContainerRequest{ContainerId: "bad", Spec: specJSON(t, withNetns(testSpec(root, "nope")))})
	if err == nil {
		t.Fatal("create of a missing command succeeded")
	}
	run("forked", withNetns(testSpec(root, "true")))
	var after int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if after = openFds(t); after <= before {
			return
		}
	}
	t.Errorf("%d file descriptors open after, %d before", after, before)
}
