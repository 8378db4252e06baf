package task

import (
	"errors"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	apitask "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/core/runtime"

	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/snapshotsvc"
)

var _ snapshotsvc.Processes = (*Service)(nil)

func (h *harness) kill(id, exec string, sig uint32) {
	h.t.Helper()
	if _, err := h.svc.Kill(h.ctx, &taskAPI.KillRequest{ID: id, ExecID: exec, Signal: sig}); err != nil {
		h.t.Fatalf("kill %s/%s: %v", id, exec, err)
	}
}

// After a rollback the shim's processes are the guest's: an exec started
// after the snapshot ends with 137 and an exit event, one that exited after
// it runs again, running ones go on (their Waits re-issued on the new
// connection), and one containerd deleted meanwhile is listed (unknown to
// containerd) and can be signalled.
func TestRollbackReconciles(t *testing.T) {
	h := newHarness(t)
	h.create("c1", []string{"sleep"}, nil, nil)
	h.start("c1", "")
	for _, e := range []string{"worker", "killed", "forgotten"} {
		h.exec("c1", e, []string{"sleep"}, h.fifos(false), false)
		h.start("c1", e)
	}
	sb, err := h.svc.SandboxOf("c1")
	if err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(t.TempDir(), "s1")
	if _, err := sb.Snapshot(h.ctx, sandbox.SnapshotOptions{Dir: snap}); err != nil {
		t.Fatal(err)
	}
	// After the snapshot: a new exec, one killed, one killed and deleted.
	h.exec("c1", "late", []string{"sleep"}, nil, false)
	h.start("c1", "late")
	h.kill("c1", "killed", 9)
	if st := h.wait("c1", "killed"); st != 137 {
		t.Fatalf("killed: %d", st)
	}
	h.kill("c1", "forgotten", 9)
	h.wait("c1", "forgotten")
	h.delete("c1", "forgotten")

	st, err := h.svc.RollbackSandbox(h.ctx, "c1", snap, "rollback to s1")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, c := range st.Processes {
		got[c.ContainerID+"/"+c.ExecID] = c.Action
	}
	want := map[string]string{"c1/": "reattached", "c1/worker": "reattached", "c1/killed": "revived",
		"c1/late": "ended", "c1/forgotten": "unknown"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	if st.VMM.Memory != "rewrite-dirty" || st.Total <= 0 {
		t.Errorf("stats %+v", st)
	}

	// The exec the snapshot did not have: 137 and an exit event.
	if s := h.wait("c1", "late"); s != 137 {
		t.Fatalf("late: %d", s)
	}
	found := false
	for _, ev := range h.find(runtime.TaskExitEventTopic) {
		if e := ev.(*eventstypes.TaskExit); e.ID == "late" && e.ExitStatus == 137 {
			found = true
		}
	}
	if !found {
		t.Fatal("no exit event 137 for the exec started after the snapshot")
	}
	// The one killed after the snapshot runs again, and ends again when killed.
	if s := h.state("c1", "killed"); s != apitask.Status_RUNNING {
		t.Fatalf("killed after the snapshot: %s after the rollback, want RUNNING", s)
	}
	h.kill("c1", "killed", 15)
	if s := h.wait("c1", "killed"); s != 143 {
		t.Fatalf("revived exec killed: %d", s)
	}
	// The worker's Wait was re-issued on the new connection.
	if s := h.state("c1", "worker"); s != apitask.Status_RUNNING {
		t.Fatalf("worker: %s", s)
	}
	h.kill("c1", "worker", 9)
	if s := h.wait("c1", "worker"); s != 137 {
		t.Fatalf("worker: %d", s)
	}
	// The deleted one: listed, not known to containerd, signalled.
	procs, err := h.svc.GuestProcesses(h.ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range procs {
		names = append(names, p.ExecID+":"+map[bool]string{true: "known", false: "unknown"}[p.Known])
	}
	sort.Strings(names)
	if strings.Join(names, ",") != ":known,forgotten:unknown,killed:known,worker:known" {
		t.Fatalf("guest processes %v", names)
	}
	if err := h.svc.SignalGuest(h.ctx, "c1", "forgotten", 9, false); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); h.agent.ProcessStatus("c1", "forgotten") != "stopped"; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the forgotten process did not end after SIGKILL")
		}
	}
}

// A rollback the VMM fails changes nothing: the processes go on, their
// Waits on the old connection still report their exits.
func TestRollbackVMMFailureKeepsProcesses(t *testing.T) {
	h := newHarness(t)
	h.create("c1", []string{"sleep"}, nil, nil)
	h.start("c1", "")
	h.exec("c1", "e1", []string{"sleep"}, nil, false)
	h.start("c1", "e1")
	h.vmm.RollbackErr = errors.New("rollback: the snapshot's kernel differs")
	if _, err := h.svc.RollbackSandbox(h.ctx, "c1", "/snaps/x", ""); err == nil || !strings.Contains(err.Error(), "kernel differs") {
		t.Fatalf("rollback: %v", err)
	}
	if n := h.agent.CallCount("ListProcesses"); n != 0 {
		t.Fatalf("reconciled after a failed rollback (%d ListProcesses)", n)
	}
	h.kill("c1", "e1", 9)
	if s := h.wait("c1", "e1"); s != 137 {
		t.Fatalf("e1: %d", s)
	}
	if s := h.state("c1", ""); s != apitask.Status_RUNNING {
		t.Fatalf("init: %s", s)
	}
	if _, err := h.svc.RollbackSandbox(h.ctx, "nope", "/snaps/x", ""); err == nil {
		t.Fatal("rollback of an unknown container")
	}
}
