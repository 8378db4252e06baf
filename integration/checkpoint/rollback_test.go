package checkpoint

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/checkpoint/cli"
	"github.com/cube-runtime/cube/integration/cubetest"
)

// workerBin is integration/snapshot/worker in the test host (TestMain builds
// it); startWorker copies it into the container.
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
	out, rc, err := d.CtrQuiet(nil, "task", "exec", "--exec-id", "q"+strings.ReplaceAll(time.Now().Format("150405.000000000"), ".", ""),
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

// rollbackRounds is issue 14's acceptance for rollback in place through the
// cube CLI: the worker (in-memory counter, random identity, pid, digest) runs
// as an exec beside container id's long-lived init, and three rounds of
// hold → cube snapshot → release → it advances → SIGKILL → cube rollback →
// every field equals the snapshot's → release → it advances, the task
// RUNNING on the same VMM pid throughout:
//  1. to snapshot A (the VM's parent), with an exec started after the
//     snapshot, which ends with 137;
//  2. to snapshot B, taken after round 1 (the VM's parent again);
//  3. to A again, which is not the VM's parent (B is): memory comes back by
//     rewrite-diff or rewrite-all, not rewrite-dirty.
//
// It returns the snapshots' ids (the sandbox holds the one it rolled back to
// until it ends).
func (d *daemons) rollbackRounds(t *testing.T, id string, vmmPid int) []string {
	t.Helper()
	wk := d.startWorker(t, id)

	a, atA := d.heldSnapshot(t, id, "round-a")
	// Round 1, with an exec the snapshot does not have.
	d.killWorker(t, id, wk)
	late := d.CtrBG(t, "task", "exec", "--exec-id", "late", id, "sleep", "1000")
	time.Sleep(time.Second)
	out := d.rollbackTo(t, id, vmmPid, "round-a", atA)
	if m := rolledBackMemory(out); m != "rewrite-dirty" {
		t.Errorf("round 1 (to the VM's parent): memory %q, want rewrite-dirty", m)
	}
	for _, want := range []string{"frozen:", "process:  " + id + "/late", "ended"} {
		if !strings.Contains(out, want) {
			t.Errorf("round 1: cube rollback's output lacks %q:\n%s", want, out)
		}
	}
	if rc, out := late.Wait(t, time.Minute); rc != 137 {
		t.Errorf("the exec started after the snapshot: rc %d, want 137\n%s", rc, out)
	}
	// The sandbox holds the snapshot: deleting it is refused, naming it.
	if out, rc := d.Cube(t, "snapshots", "rm", "round-a"); rc != 1 || !strings.Contains(out, `"sandbox e2e/`+id+`"`) {
		t.Errorf("rm of the snapshot the sandbox rolled back to: rc %d\n%s", rc, out)
	}

	// Round 2: the revived worker's exec was deleted by containerd (its ctr
	// ended with 137): cube ps lists it, cube kill ends it.
	b, atB := d.heldSnapshot(t, id, "round-b")
	d.killWorker(t, id, nil)
	if m := rolledBackMemory(d.rollbackTo(t, id, vmmPid, "round-b", atB)); m != "rewrite-dirty" {
		t.Errorf("round 2 (to the VM's parent): memory %q, want rewrite-dirty", m)
	}

	// Round 3: back to A, which is not the VM's parent.
	d.killWorker(t, id, nil)
	if m := rolledBackMemory(d.rollbackTo(t, id, vmmPid, "round-a", atA)); m != "rewrite-diff" && m != "rewrite-all" {
		t.Errorf("round 3 (to a snapshot other than the VM's parent): memory %q, want rewrite-diff or rewrite-all", m)
	}
	return []string{a, b}
}

// heldSnapshot holds the worker in container id, takes `cube snapshot
// --name name`, checks the held worker did not change across it, releases it
// and waits until it advances; it returns the snapshot's id and the worker's
// state in it.
func (d *daemons) heldSnapshot(t *testing.T, id, name string) (string, workerState) {
	t.Helper()
	at := d.workerAnswers(t, id, "hold")
	snap := d.CubeJSON(t, "snapshot", id, "--name", name, "--json")
	if st := d.workerAnswers(t, id, "query"); !st.same(at) {
		t.Fatalf("the held worker changed across snapshot %s: %+v, then %+v", name, at, st)
	}
	d.workerAnswers(t, id, "release")
	d.workerAbove(t, id, at.Counter)
	return snap.ID, at
}

// killWorker SIGKILLs the worker and waits until it no longer answers.
// With its exec's ctr (wk) it is `ctr task kill --exec-id worker`, and the exec
// ends 137. Without (a worker a rollback revived after containerd deleted
// its exec, so ctr cannot reach it): `cube ps` lists it as unknown to
// containerd, and `cube kill --exec worker` ends it.
func (d *daemons) killWorker(t *testing.T, id string, wk *cubetest.BG) {
	t.Helper()
	if wk != nil {
		args := []string{"task", "kill", "-s", "SIGKILL", "--exec-id", "worker", id}
		if out, rc, err := d.CtrQuiet(nil, args...); err != nil || rc != 0 {
			t.Fatalf("kill the worker (ctr %s): rc %d %v\n%s", strings.Join(args, " "), rc, err, out)
		}
		if rc, out := wk.Wait(t, time.Minute); rc != 137 {
			t.Fatalf("the killed worker's exec: rc %d, want 137\n%s", rc, out)
		}
	} else {
		out, _, rc := d.CubeRun(t, "ps", id, "--json")
		var procs []cli.Process
		if err := json.Unmarshal([]byte(out), &procs); rc != 0 || err != nil {
			t.Fatalf("cube ps --json: rc %d %v\n%s", rc, err, out)
		}
		found := false
		for _, p := range procs {
			if p.Exec == "worker" {
				found = true
				// PID is the guest's (the agent's namespace), not the worker's own view in its container.
				if p.Known || p.Status != "running" || p.PID == 0 {
					t.Errorf("cube ps: the revived worker is %+v, want running with a guest pid, unknown to containerd", p)
				}
			}
		}
		if !found {
			t.Fatalf("cube ps does not list the revived worker:\n%s", out)
		}
		if out, rc := d.Cube(t, "kill", id, "--exec", "worker", "--signal", "KILL"); rc != 0 {
			t.Fatalf("cube kill --exec worker: rc %d\n%s", rc, out)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, ok := d.worker(t, id, "query")
		if !ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed worker still answers: %+v", st)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// rollbackTo runs `cube rollback id ref` and checks that the worker answers
// with want exactly, the task runs on in the same VMM, and, released, the
// worker and the init's counter advance. It returns cube rollback's output.
func (d *daemons) rollbackTo(t *testing.T, id string, vmmPid int, ref string, want workerState) string {
	t.Helper()
	out, errOut, rc := d.CubeRun(t, "rollback", id, ref)
	if rc != 0 {
		t.Fatalf("cube rollback %s: rc %d\n%s%s", ref, rc, out, errOut)
	}
	if got := d.workerAnswers(t, id, "query"); !got.same(want) {
		t.Fatalf("after the rollback to %s the worker is %+v, want the snapshot's %+v", ref, got, want)
	}
	if now := d.Tasks(t)[id]; now.Status != "RUNNING" || now.PID != vmmPid {
		t.Errorf("after the rollback to %s the task is %+v, want RUNNING with VMM pid %d", ref, now, vmmPid)
	}
	d.workerAnswers(t, id, "release")
	d.workerAbove(t, id, want.Counter)
	d.CounterAbove(t, id, d.ReadCounter(t, id))
	return out
}

// rolledBackMemory is how cube rollback's output says memory came back
// (its "memory:" row's first word).
func rolledBackMemory(out string) string {
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, "memory:"); ok {
			if f := strings.Fields(v); len(f) > 0 {
				return f[0]
			}
		}
	}
	return ""
}
