package shim

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

// workerBin is integration/snapshot/worker in the test host (TestMain builds
// it); rollbackRound copies it into the container.
const workerBin = "/cube/bin/worker"

// workerSock is the worker's socket in the container (its rootfs, which
// rolls back with the VM).
const workerSock = "/tmp/worker.sock"

// workerState is the worker's answer (integration/snapshot/worker's State).
type workerState struct {
	Counter  int64  `json:"counter"`
	Held     bool   `json:"held"`
	Identity string `json:"identity"`
	PID      int    `json:"pid"`
	Digest   string `json:"digest"`
}

func (w workerState) same(o workerState) bool {
	return w.Counter == o.Counter && w.Held == o.Held && w.Identity == o.Identity && w.PID == o.PID && w.Digest == o.Digest
}

// worker asks the worker in container id (a `ctr task exec` of its client
// mode); ok is false when it does not answer.
func (d *daemons) worker(t *testing.T, id, cmd string) (workerState, bool) {
	t.Helper()
	out, rc, err := d.ctrQuiet(nil, "task", "exec", "--exec-id", "q"+strings.ReplaceAll(time.Now().Format("150405.000000000"), ".", ""),
		id, "/worker", workerSock, cmd)
	var st workerState
	if err != nil || rc != 0 || json.Unmarshal([]byte(strings.TrimSpace(out)), &st) != nil {
		return workerState{}, false
	}
	return st, true
}

// workerAnswers waits until the worker answers cmd.
func (d *daemons) workerAnswers(t *testing.T, id, cmd string) workerState {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if st, ok := d.worker(t, id, cmd); ok {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the worker does not answer %q", id, cmd)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// workerAbove waits until the worker's counter passes n.
func (d *daemons) workerAbove(t *testing.T, id string, n int64) workerState {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		st := d.workerAnswers(t, id, "query")
		if st.Counter > n {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the worker's counter stays at %d", id, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// rollbackRound is the acceptance round of a rollback in place through the
// cube CLI (issue 14): the worker (in-memory counter, random identity, pid,
// digest) runs as an exec beside container id's long-lived init: hold →
// cube snapshot → release → it advances → SIGKILL → an exec started after
// the snapshot → cube rollback → every field equals the snapshot's, the
// late exec ends with 137, the same VMM pid → release → it advances. It
// returns the snapshot's id (the sandbox holds it until it ends).
func (d *daemons) rollbackRound(t *testing.T, id string, vmmPid int) string {
	t.Helper()
	bin, err := os.Open(workerBin)
	if err != nil {
		t.Fatalf("the worker binary: %v", err)
	}
	defer bin.Close()
	if out, rc, err := d.ctrQuiet(bin, "task", "exec", "--exec-id", "cp-worker", id, "sh", "-c", "cat > /worker && busybox chmod 755 /worker"); err != nil || rc != 0 {
		t.Fatalf("copy the worker into %s: rc %d %v\n%s", id, rc, err, out)
	}
	wk := d.ctrBG(t, "task", "exec", "--exec-id", "worker", id, "/worker", "serve", workerSock)
	d.workerAbove(t, id, 0)

	at := d.workerAnswers(t, id, "hold")
	snap := d.cubeJSON(t, "snapshot", id, "--name", "before-kill", "--json")
	if st := d.workerAnswers(t, id, "query"); !st.same(at) {
		t.Fatalf("the held worker changed across the snapshot: %+v, then %+v", at, st)
	}
	d.workerAnswers(t, id, "release")
	after := d.workerAbove(t, id, at.Counter)

	// SIGKILL the worker: its exec ends 137, it answers no more.
	if out, rc, err := d.ctrQuiet(nil, "task", "kill", "-s", "SIGKILL", "--exec-id", "worker", id); err != nil || rc != 0 {
		t.Fatalf("kill the worker: rc %d %v\n%s", rc, err, out)
	}
	if rc, out := wk.wait(t, time.Minute); rc != 137 {
		t.Fatalf("the killed worker's exec: rc %d, want 137\n%s", rc, out)
	}
	if st, ok := d.worker(t, id, "query"); ok {
		t.Fatalf("the killed worker still answers: %+v", st)
	}
	// An exec the snapshot does not have.
	late := d.ctrBG(t, "task", "exec", "--exec-id", "late", id, "sleep", "1000")
	time.Sleep(time.Second)

	out, errOut, rc := d.cubeRun(t, "rollback", id, "before-kill")
	if rc != 0 {
		t.Fatalf("cube rollback: rc %d\n%s%s", rc, out, errOut)
	}
	for _, want := range []string{"memory:", "frozen:", "process:  " + id + "/late", "ended"} {
		if !strings.Contains(out, want) {
			t.Errorf("cube rollback's output lacks %q:\n%s", want, out)
		}
	}

	// The worker answers again with the snapshot's state exactly.
	got := d.workerAnswers(t, id, "query")
	if !got.same(at) {
		t.Fatalf("after the rollback the worker is %+v, want the snapshot's %+v (before the kill it was at %d)", got, at, after.Counter)
	}
	if rc, out := late.wait(t, time.Minute); rc != 137 {
		t.Errorf("the exec started after the snapshot: rc %d, want 137\n%s", rc, out)
	}
	if now := d.tasks(t)[id]; now.status != "RUNNING" || now.pid != vmmPid {
		t.Errorf("after the rollback the task is %+v, want RUNNING with VMM pid %d", now, vmmPid)
	}
	d.workerAnswers(t, id, "release")
	d.workerAbove(t, id, at.Counter)
	d.counterAbove(t, id, d.readCounter(t, id))

	// The sandbox holds the snapshot: deleting it is refused, naming it.
	if out, rc := d.cube(t, "snapshots", "rm", "before-kill"); rc != 1 || !strings.Contains(out, `"sandbox e2e/`+id+`"`) {
		t.Errorf("rm of the snapshot the sandbox rolled back to: rc %d\n%s", rc, out)
	}
	// The revived worker is an exec containerd knows again: SIGKILL ends it.
	if out, rc, err := d.ctrQuiet(nil, "task", "kill", "-s", "SIGKILL", "--exec-id", "worker", id); err != nil || rc != 0 {
		t.Logf("kill the revived worker: rc %d %v\n%s", rc, err, out)
	}
	return snap.ID
}
