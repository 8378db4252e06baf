package snapshot

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cube-runtime/cube/guest-agent/protocol"
	"github.com/cube-runtime/cube/hypervisor/control"
	"github.com/cube-runtime/cube/hypervisor/vsockdial"
	"github.com/cube-runtime/cube/integration/vmmrun"
)

// workerState is the worker's JSON answer (./worker).
type workerState struct {
	Counter     int64  `json:"counter"`
	Held        bool   `json:"held"`
	Identity    string `json:"identity"`
	PID         int    `json:"pid"`
	Digest      string `json:"digest"`
	NowUnixNano int64  `json:"now_unix_nano"`
}

// digest is sha256(identity, counter) as the worker computes it, recomputed here independently.
func digest(identity string, counter int64) string {
	s := sha256.Sum256([]byte(identity + "\x00" + strconv.FormatInt(counter, 10)))
	return hex.EncodeToString(s[:])
}

// probe is what must come back exactly after a rollback or restore: the worker's own answer (counter, held,
// identity, its pid in its pid namespace, digest) and its pid in the guest as the agent lists it.
type probe struct {
	Counter  int64
	Held     bool
	Identity string
	PID      int
	Digest   string
	GuestPID uint32
}

// sandbox is one cube-vmm with its agent.
type sandbox struct {
	t       *testing.T
	vmm     *vmmrun.Process
	dir     string
	uds     string
	ctlSock string
	ctl     *control.Client
	client  protocol.AgentService
	tc      *ttrpc.Client
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

// connect (re)connects to the agent, waiting until it answers.
func (s *sandbox) connect(timeout time.Duration) time.Duration {
	s.t.Helper()
	if s.tc != nil {
		s.tc.Close()
	}
	start := time.Now()
	s.tc, s.client = s.vmm.DialAgent(s.t, s.uds, timeout)
	return time.Since(start)
}

func (s *sandbox) dialControl() {
	s.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := control.Dial(context.Background(), s.ctlSock)
		if err == nil {
			s.ctl = c
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("control socket: %v\nstderr:\n%s", err, s.vmm.Stderr())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func spec(args ...string) []byte {
	b, _ := json.Marshal(&specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{Args: args, Cwd: "/", Env: []string{"PATH=/bin"}},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs"},
		},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.MountNamespace}, {Type: specs.PIDNamespace}}},
	})
	return b
}

var execSeq atomic.Int64

// ask runs the worker's client mode in the worker container (agent ExecProcess) and decodes its answer.
func (s *sandbox) ask(cmd string) (workerState, error) {
	id := fmt.Sprintf("ask-%d", execSeq.Add(1))
	proc, _ := json.Marshal(&specs.Process{Args: []string{workerBin, workerSock, cmd}, Cwd: "/", Env: []string{"PATH=/bin"}})
	var st workerState
	if _, err := s.client.ExecProcess(ctx(s.t), &protocol.ExecProcessRequest{ContainerId: "worker", ExecId: id, Process: proc,
		Stdio: &protocol.Stdio{Stdout: true}}); err != nil {
		return st, fmt.Errorf("exec %s: %w", cmd, err)
	}
	defer s.client.Delete(ctx(s.t), &protocol.DeleteRequest{ContainerId: "worker", ExecId: id, Force: true})
	conn, err := vsockdial.Dial(ctx(s.t), s.uds, protocol.StreamPort)
	if err != nil {
		return st, err
	}
	defer conn.Close()
	if err := protocol.OpenStream(conn, protocol.StreamHeader{ContainerID: "worker", ExecID: id, Stream: protocol.Stdout}); err != nil {
		return st, fmt.Errorf("stdout of %s: %w", cmd, err)
	}
	if _, err := s.client.Start(ctx(s.t), &protocol.StartRequest{ContainerId: "worker", ExecId: id}); err != nil {
		return st, fmt.Errorf("start %s: %w", cmd, err)
	}
	conn.SetReadDeadline(time.Now().Add(time.Minute))
	out, _ := io.ReadAll(conn)
	w, err := s.client.Wait(ctx(s.t), &protocol.WaitRequest{ContainerId: "worker", ExecId: id})
	if err != nil {
		return st, err
	}
	if w.ExitStatus != 0 {
		return st, fmt.Errorf("worker %s exited %d: %q", cmd, w.ExitStatus, out)
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, fmt.Errorf("worker %s answered %q: %w", cmd, out, err)
	}
	if st.Digest != digest(st.Identity, st.Counter) {
		return st, fmt.Errorf("worker %s: digest %s does not match counter %d, identity %s", cmd, st.Digest, st.Counter, st.Identity)
	}
	return st, nil
}

func (s *sandbox) mustAsk(cmd string) workerState {
	s.t.Helper()
	st, err := s.ask(cmd)
	if err != nil {
		s.t.Fatalf("%v\n%s", err, s.diagnose())
	}
	return st
}

// diagnose says what a failing call leaves to look at: whether the agent answers on a new connection, the VMM's
// view, the console and the VMM's stderr.
func (s *sandbox) diagnose() string {
	var b strings.Builder
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if conn, err := vsockdial.Dial(c, s.uds, protocol.AgentPort); err != nil {
		fmt.Fprintf(&b, "new agent connection: %v\n", err)
	} else {
		tc := ttrpc.NewClient(conn)
		h, err := protocol.NewAgentClient(tc).Health(c, &protocol.HealthRequest{})
		fmt.Fprintf(&b, "health on a new connection: %v %v\n", h, err)
		tc.Close()
	}
	if s.ctl != nil {
		var info json.RawMessage
		err := s.ctl.Info(context.Background(), &info)
		fmt.Fprintf(&b, "vmm info: %s %v\n", info, err)
	}
	if st, ok := s.vmm.Exited(); ok {
		fmt.Fprintf(&b, "cube-vmm exited with status %d\n", st)
	}
	fmt.Fprintf(&b, "console:\n%s\nstderr:\n%s", s.vmm.ConsoleTail(), s.vmm.Stderr())
	return b.String()
}

// read returns the worker's probe.
func (s *sandbox) read() probe {
	s.t.Helper()
	st := s.mustAsk("query")
	pids, err := s.client.ListPids(ctx(s.t), &protocol.ListPidsRequest{ContainerId: "worker"})
	if err != nil || len(pids.Pids) == 0 {
		s.t.Fatalf("worker pids: %v %v\n%s", pids, err, s.diagnose())
	}
	return probe{Counter: st.Counter, Held: st.Held, Identity: st.Identity, PID: st.PID, Digest: st.Digest, GuestPID: pids.Pids[0]}
}

// hold stops (or restarts) the worker's increments.
func (s *sandbox) hold(on bool) {
	s.t.Helper()
	cmd := "release"
	if on {
		cmd = "hold"
	}
	if st := s.mustAsk(cmd); st.Held != on {
		s.t.Fatalf("%s: worker says held=%v", cmd, st.Held)
	}
}

func (s *sandbox) waitAdvance(from int64) probe {
	s.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		p := s.read()
		if p.Counter > from+2 {
			return p
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("counter stuck at %d (from %d)", p.Counter, from)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *sandbox) health() *protocol.HealthResponse {
	s.t.Helper()
	h, err := s.client.Health(ctx(s.t), &protocol.HealthRequest{})
	if err != nil {
		s.t.Fatalf("health: %v", err)
	}
	return h
}

// afterRestore checks what the guest does after a rollback or restore, against the agent's health at the
// snapshot (before): the agent noticed the vsock transport reset and reseeded the CRNG on its own; then the
// host thaws the filesystems frozen for the snapshot, steps the guest clock (which resumed at snapshot time)
// and reseeds the RNG with host entropy.
func (s *sandbox) afterRestore(what string, before *protocol.HealthResponse) {
	s.t.Helper()
	var h *protocol.HealthResponse
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		h = s.health()
		if h.TransportResets > before.TransportResets && h.RngReseeds > before.RngReseeds {
			break
		}
		if time.Now().After(deadline) {
			var irqs []string
			if r, err := s.client.ReadFile(ctx(s.t), &protocol.ReadFileRequest{Path: "/proc/interrupts"}); err == nil {
				for _, l := range strings.Split(string(r.Data), "\n") {
					if strings.Contains(l, "virtio") {
						irqs = append(irqs, strings.Join(strings.Fields(l), " "))
					}
				}
			}
			s.t.Fatalf("%s: agent health %+v, at the snapshot %+v: the transport reset (or the agent's own reseed) "+
				"was not noticed; guest virtio interrupts: %q\nconsole:\n%s", what, h, before, irqs, s.vmm.ConsoleTail())
		}
	}
	if h.TransportResets != before.TransportResets+1 {
		s.t.Errorf("%s: %d transport resets counted since the snapshot, want 1", what, h.TransportResets-before.TransportResets)
	}
	if _, err := s.client.ThawFilesystems(ctx(s.t), &protocol.ThawRequest{}); err != nil {
		s.t.Fatalf("%s: thaw: %v", what, err)
	}
	stale := s.mustAsk("time")
	set := time.Now()
	if _, err := s.client.SetTime(ctx(s.t), &protocol.SetTimeRequest{UnixNano: set.UnixNano()}); err != nil {
		s.t.Fatalf("set time: %v", err)
	}
	g := s.mustAsk("time")
	after := time.Now()
	guest := time.Unix(0, g.NowUnixNano)
	// The guest clock was stepped to set and ran since: it must read between set and now (1 s for rounding).
	if guest.Before(set.Add(-time.Second)) || guest.After(after.Add(time.Second)) {
		s.t.Errorf("%s: guest clock %v after SetTime(%v), host now %v", what, guest, set, after)
	}
	e := make([]byte, 64)
	rand.Read(e)
	if _, err := s.client.ReseedRandom(ctx(s.t), &protocol.ReseedRandomRequest{Entropy: e}); err != nil {
		s.t.Fatalf("reseed: %v", err)
	}
	h2 := s.health()
	if h2.RngReseeds != h.RngReseeds+1 {
		s.t.Errorf("%s: rng_reseeds %d after ReseedRandom, was %d", what, h2.RngReseeds, h.RngReseeds)
	}
	s.t.Logf("%s: agent noticed the transport reset (resets %d→%d, own reseeds %d→%d); guest clock was %v behind, stepped",
		what, before.TransportResets, h.TransportResets, before.RngReseeds, h.RngReseeds,
		set.Sub(time.Unix(0, stale.NowUnixNano)).Round(time.Millisecond))
}

func (s *sandbox) controlOp(op string, f func() (any, error)) {
	s.t.Helper()
	res, err := f()
	if err != nil {
		s.t.Fatalf("%s: %v\nstderr:\n%s", op, err, s.vmm.Stderr())
	}
	s.t.Logf("%s: %+v", op, res)
}

func (s *sandbox) fileGone(p string) {
	s.t.Helper()
	if _, err := s.client.ReadFile(ctx(s.t), &protocol.ReadFileRequest{Path: p}); err == nil {
		s.t.Errorf("%s written after the snapshot survived", p)
	}
}

// kill SIGKILLs the worker and checks it is gone.
func (s *sandbox) kill(p probe) {
	s.t.Helper()
	if _, err := s.client.Signal(ctx(s.t), &protocol.SignalRequest{ContainerId: "worker", Signal: uint32(syscall.SIGKILL)}); err != nil {
		s.t.Fatal(err)
	}
	w, err := s.client.Wait(ctx(s.t), &protocol.WaitRequest{ContainerId: "worker"})
	if err != nil || w.Signal != uint32(syscall.SIGKILL) {
		s.t.Fatalf("worker not killed: %+v %v", w, err)
	}
	if pids, err := s.client.ListPids(ctx(s.t), &protocol.ListPidsRequest{ContainerId: "worker"}); err == nil && len(pids.Pids) > 0 {
		s.t.Fatalf("worker still has pids %v", pids.Pids)
	}
	if _, err := s.client.ReadFile(ctx(s.t), &protocol.ReadFileRequest{Path: fmt.Sprintf("/proc/%d/stat", p.GuestPID)}); err == nil {
		s.t.Fatalf("guest pid %d still exists after SIGKILL", p.GuestPID)
	}
	if st, err := s.ask("query"); err == nil {
		s.t.Fatalf("killed worker still answers: %+v", st)
	}
}

// vmmProcesses lists processes whose command line mentions dir (the cube-vmm processes of this test).
func vmmProcesses(dir string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || e.Name() == "self" || e.Name() == "thread-self" {
			continue
		}
		if cl := strings.ReplaceAll(string(b), "\x00", " "); strings.Contains(cl, dir) {
			out = append(out, e.Name()+": "+cl)
		}
	}
	return out
}

// rollbackTarget is a snapshot and what the worker and the agent said when it was taken.
type rollbackTarget struct {
	dir    string
	worker probe
	agent  *protocol.HealthResponse
}

// alternate rolls the VM back CUBE_E2E_ALTERNATE_ROLLBACKS times (default 10) alternately to each target,
// each time one that is not the VM's parent (so the rollback rewrites the pages the two snapshots' layers
// differ in, plus those written since), with the worker running in between: after each one the agent
// answers, notices the reset, and the worker is exactly as at that snapshot. Issue 14 item 7 asks for ≥ 100
// in a row without a failure: CUBE_E2E_ALTERNATE_ROLLBACKS=100 make e2e E2E_PKGS=./integration/snapshot.
func alternate(t *testing.T, s *sandbox, targets []rollbackTarget) {
	t.Helper()
	n := 10
	if v := os.Getenv("CUBE_E2E_ALTERNATE_ROLLBACKS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 0 {
			t.Fatalf("CUBE_E2E_ALTERNATE_ROLLBACKS=%q: want a number of rollbacks ≥ 0", v)
		}
	}
	var frozen []time.Duration
	modes := map[string]int{}
	for i := 0; i < n; i++ {
		tg := targets[i%len(targets)]
		label := fmt.Sprintf("alternating rollback %d/%d to %s", i+1, n, filepath.Base(tg.dir))
		s.hold(false)
		s.waitAdvance(tg.worker.Counter)
		var rb control.RollbackResult
		s.controlOp(label, func() (any, error) {
			var err error
			rb, err = s.ctl.Rollback(context.Background(), tg.dir)
			return rb, err
		})
		if rb.Memory != "rewrite-diff" {
			t.Fatalf("%s: memory %q, want rewrite-diff (the two snapshots share their base layer)", label, rb.Memory)
		}
		modes[rb.Memory]++
		frozen = append(frozen, time.Duration(rb.FrozenMS*float64(time.Millisecond)))
		s.connect(time.Minute)
		s.afterRestore(label, tg.agent)
		if got := s.read(); got != tg.worker {
			t.Fatalf("%s: worker %+v, the snapshot had %+v", label, got, tg.worker)
		}
	}
	t.Logf("%d alternating rollbacks between %d snapshots, every one exact (memory %v); frozen: %v", n, len(targets), modes, frozen)
}

// TestRollbackAndRestore is the acceptance test of issue 5.
func TestRollbackAndRestore(t *testing.T) {
	dir := t.TempDir()
	s := &sandbox{t: t, dir: dir, uds: filepath.Join(dir, "vsock.sock"), ctlSock: filepath.Join(dir, "ctl.sock")}
	disk := filepath.Join(dir, "rootfs.img")
	b, err := os.ReadFile(rootfsImage)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(disk, b, 0o644); err != nil {
		t.Fatal(err)
	}
	s.vmm = vmmrun.Start(t, cubeVMM, "-kernel", guestKernel, "-initrd", guestInitrd, "-memory", "256",
		"-cmdline", "console=ttyS0 panic=-1 quiet", "-vsock", s.uds, "-disk", disk+",serial=rootfs0", "-control", s.ctlSock)
	t.Logf("agent up after %v", s.connect(3*time.Minute))
	s.dialControl()
	md, err := s.client.MountDisk(ctx(t), &protocol.MountDiskRequest{Serial: "rootfs0"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.CreateContainer(ctx(t), &protocol.CreateContainerRequest{ContainerId: "worker", Rootfs: md.MountPoint,
		Spec: spec(workerBin, "serve", workerSock)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.Start(ctx(t), &protocol.StartRequest{ContainerId: "worker"}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		_, err := s.ask("query")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker never answered: %v", err)
		}
	}
	s.waitAdvance(0)
	marker := filepath.Join(md.MountPoint, "after-snapshot.txt")

	// Hold → snapshot (inside the filesystem freeze window) → release.
	s.hold(true)
	saved := s.read()
	if !saved.Held {
		t.Fatalf("worker not held: %+v", saved)
	}
	atSnap := s.health()
	fr, err := s.client.FreezeFilesystems(ctx(t), &protocol.FreezeRequest{})
	if err != nil || len(fr.Frozen) == 0 {
		t.Fatalf("freeze: %v %v", fr, err)
	}
	snap := filepath.Join(dir, "snap")
	s.controlOp("snapshot", func() (any, error) { return s.ctl.Snapshot(context.Background(), snap, false) })
	if _, err := s.client.ThawFilesystems(ctx(t), &protocol.ThawRequest{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot state %+v (filesystems %v frozen)", saved, fr.Frozen)
	if again := s.read(); again != saved {
		t.Fatalf("held worker moved across the snapshot: %+v then %+v", saved, again)
	}

	// One round: release, let it count, write a file, SIGKILL the worker, roll back, check everything came
	// back; mode is how the rollback must have brought memory back.
	rollbackRound := func(label, mode string) {
		t.Helper()
		s.hold(false)
		moved := s.waitAdvance(saved.Counter)
		if _, err := s.client.WriteFile(ctx(t), &protocol.WriteFileRequest{Path: marker, Data: []byte("later")}); err != nil {
			t.Fatal(err)
		}
		s.client.SyncFilesystems(ctx(t), &protocol.Empty{})
		s.kill(moved)
		t.Logf("%s: worker advanced to %d, then was killed", label, moved.Counter)

		start := time.Now()
		var rb control.RollbackResult
		s.controlOp("rollback", func() (any, error) {
			var err error
			rb, err = s.ctl.Rollback(context.Background(), snap)
			return rb, err
		})
		if rb.Memory != mode {
			t.Fatalf("%s: rollback result %+v: want memory %q", label, rb, mode)
		}
		if mode == "rewrite-dirty" && rb.Pages == 0 {
			t.Fatalf("%s: the guest ran and wrote, yet the rollback rewrote no page: %+v", label, rb)
		}
		t.Logf("%s: agent back %v after the rollback call (%v in all)", label, s.connect(time.Minute), time.Since(start))
		s.afterRestore(label, atSnap)
		if got := s.read(); got != saved {
			t.Fatalf("%s: after rollback %+v, snapshot had %+v", label, got, saved)
		}
		s.fileGone(marker)
		s.hold(false)
		s.waitAdvance(saved.Counter)
		s.hold(true)
		t.Logf("%s: rolled back to %+v and advancing again", label, saved)
	}
	// The snapshot is the VM's parent (it took it, then rolled back to it): each rollback rewrites the pages
	// written since.
	rounds := 3
	if v := os.Getenv("CUBE_E2E_ROLLBACK_ROUNDS"); v != "" {
		if rounds, err = strconv.Atoi(v); err != nil || rounds < 1 {
			t.Fatalf("CUBE_E2E_ROLLBACK_ROUNDS=%q: want a number of rollback rounds ≥ 1", v)
		}
	}
	for round := 1; round <= rounds; round++ {
		rollbackRound(fmt.Sprintf("rollback %d", round), "rewrite-dirty")
	}

	// An incremental snapshot over the one rolled back to: only the pages dirtied since the rollback. It is the
	// parent now, so a rollback to the full snapshot remaps guest memory from the snapshot's file.
	inc := filepath.Join(dir, "snap-inc")
	savedInc, atInc := s.read(), s.health()
	if !savedInc.Held {
		t.Fatalf("worker not held before the incremental snapshot: %+v", savedInc)
	}
	s.controlOp("incremental snapshot", func() (any, error) { return s.ctl.Snapshot(context.Background(), inc, true) })
	rollbackRound("rollback to a snapshot other than the parent", "rewrite-diff")
	alternate(t, s, []rollbackTarget{{inc, savedInc, atInc}, {snap, saved, atSnap}})

	// Stop the VMM, delete its disk, start a new one from the snapshot.
	if _, err := s.client.WriteFile(ctx(t), &protocol.WriteFileRequest{Path: marker, Data: []byte("later")}); err != nil {
		t.Fatal(err)
	}
	s.client.SyncFilesystems(ctx(t), &protocol.Empty{})
	s.ctl.Stop(context.Background())
	if st := s.vmm.Wait(t, time.Minute); st != 12 {
		t.Fatalf("cube-vmm exit %d after stop, want 12", st)
	}
	s.ctl.Close()
	if err := os.Remove(disk); err != nil {
		t.Fatal(err)
	}
	if ps := vmmProcesses(dir); len(ps) != 0 {
		t.Fatalf("cube-vmm still running after stop: %q", ps)
	}
	// A restored VM: the agent answers, notices the reset, the worker is exactly as saved and counts on, the
	// file written after the snapshot is gone; then the VMM stops.
	checkRestored := func(what string, start time.Time) {
		t.Helper()
		s.connect(time.Minute)
		t.Logf("%s: to the agent answering: %v", what, time.Since(start))
		s.afterRestore(what, atSnap)
		if got := s.read(); got != saved {
			t.Fatalf("after the %s %+v, snapshot had %+v", what, got, saved)
		}
		s.fileGone(marker)
		s.hold(false)
		s.waitAdvance(saved.Counter)
		t.Logf("%s: %+v, advancing", what, saved)
		s.ctl.Stop(context.Background())
		if st := s.vmm.Wait(t, time.Minute); st != 12 {
			t.Errorf("cube-vmm exit %d after stop (%s), want 12", st, what)
		}
		s.ctl.Close()
	}
	start := time.Now()
	s.vmm = vmmrun.Start(t, cubeVMM, "restore", "-log-level", "info", snap)
	s.dialControl()
	checkRestored("restore into a new process", start)
	if err := os.Remove(disk); err != nil {
		t.Fatal(err)
	}

	// The same snapshot into a standby cube-vmm started ahead of time (its KVM VM already made): the restore
	// op on its control socket, which then controls the restored VM.
	s.vmm = vmmrun.Start(t, cubeVMM, "restore", "-standby", "-control", s.ctlSock, "-log-level", "info")
	s.dialControl()
	var info struct{ State string }
	if err := s.ctl.Info(context.Background(), &info); err != nil || info.State != "standby" {
		t.Fatalf("standby cube-vmm info: %q %v", info.State, err)
	}
	start = time.Now()
	s.controlOp("standby restore", func() (any, error) { return s.ctl.Restore(context.Background(), snap, false) })
	checkRestored("restore into a standby process", start)
	s.tc.Close()

	// Nothing the test made remains: no cube-vmm, no socket; the snapshots and the restored disk copy are
	// removed, and then the directory is empty (no rollback temp file or snapshot temp directory either).
	if ps := vmmProcesses(dir); len(ps) != 0 {
		t.Errorf("cube-vmm processes left: %q", ps)
	}
	for _, p := range []string{s.uds, s.ctlSock} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s left behind", p)
		}
	}
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	t.Logf("left in the test directory before cleanup: %q", names)
	for _, n := range []string{"snap", "snap-inc", "rootfs.img"} {
		if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
			t.Error(err)
		}
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		var left []string
		for _, e := range ents {
			left = append(left, e.Name())
		}
		t.Errorf("test directory not empty after removing the snapshots and the disk: %q %v", left, err)
	}
	if _, err := os.Stat(disk); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("disk copy %s remains: %v", disk, err)
	}
}
