package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRollback: a background command running at the snapshot, killed
// after it, comes back with the rollback and is listed and killable; a
// command started after the snapshot ends; the sandbox id stays.
func TestRollback(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(nil).SandboxID
	worker, _, closeWorker := e.startStream(id, `{"cmd":"sleep","args":["worker"]}`)
	closeWorker()
	sn := e.snapshot(id, "before")
	late, lateSC, closeLate := e.startStream(id, `{"cmd":"sleep","args":["late"]}`)
	defer closeLate()
	workerPath := fmt.Sprintf("/sandboxes/%s/commands/%d", id, worker.Pid)
	e.want("POST", workerPath+"/kill", nil, 204, nil)
	e.waitCommands(id, func(l []CommandInfo) bool { return len(l) == 1 && l[0].Pid == late.Pid })

	var rb RollbackInfo
	e.want("POST", "/sandboxes/"+id+"/rollback", map[string]any{"snapshotID": "before"}, 200, &rb)
	if rb.SandboxID != id || rb.SnapshotID != sn.SnapshotID || rb.Memory != "rewrite-dirty" || rb.TotalMs != 9 || rb.FrozenMs != 2 {
		t.Errorf("rollback: %+v", rb)
	}
	actions := map[uint32]string{}
	for _, p := range rb.Processes {
		if !p.Command {
			t.Errorf("process %+v is not marked a command", p)
		}
		actions[p.Pid] = p.Action
	}
	if actions[worker.Pid] != "unknown" || actions[late.Pid] != "ended" {
		t.Errorf("processes: %+v", rb.Processes)
	}
	// The late command's stream ends with 137.
	var ev Event
	for lateSC.Scan() {
		if strings.Contains(lateSC.Text(), `"exit"`) {
			_ = json.Unmarshal(lateSC.Bytes(), &ev)
			break
		}
	}
	if ev.ExitCode == nil || *ev.ExitCode != 137 {
		t.Errorf("the command started after the snapshot: %+v", ev)
	}
	// The worker is back: listed at once with its description, then killed through the shim.
	l := e.waitCommands(id, func(l []CommandInfo) bool { return len(l) == 1 })
	if l[0].Pid != worker.Pid || l[0].Cmd != "sleep" || len(l[0].Args) != 1 || l[0].Args[0] != "worker" {
		t.Fatalf("after the rollback: %+v", l)
	}
	e.wantError("POST", workerPath+"/stdin", map[string]any{"data": "x"}, 409, "stdin")
	e.want("POST", workerPath+"/kill", map[string]any{"signal": "SIGKILL"}, 204, nil)
	e.waitCommands(id, func(l []CommandInfo) bool { return len(l) == 0 })
	var sb Sandbox
	e.want("GET", "/sandboxes/"+id, nil, 200, &sb)
	if sb.State != "running" {
		t.Errorf("after the rollback: %+v", sb)
	}
	// The sandbox holds the snapshot it rolled back to.
	var si SnapshotInfo
	e.want("GET", "/snapshots/"+sn.SnapshotID, nil, 200, &si)
	if !si.InUse {
		t.Errorf("snapshot not held: %+v", si)
	}
	_, b := e.do("GET", "/metrics", nil)
	if !strings.Contains(string(b), `cube_api_rollback_duration_seconds_count{result="ok"} 1`) {
		t.Errorf("no rollback histogram:\n%s", b)
	}
}

// waitCommands lists the sandbox's commands until ok says so.
func (e *env) waitCommands(id string, ok func([]CommandInfo) bool) []CommandInfo {
	e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var l []CommandInfo
		e.want("GET", "/sandboxes/"+id+"/commands", nil, 200, &l)
		if ok(l) {
			return l
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("commands: %+v", l)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestRollbackErrors(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(nil).SandboxID
	sn := e.snapshot(id, "s")
	path := "/sandboxes/" + id + "/rollback"
	e.wantError("POST", path, nil, 400, "empty")
	e.wantError("POST", path, map[string]any{}, 400, `"snapshotID" is required`)
	e.wantError("POST", path, `{"snapshotID": 5}`, 400, `"snapshotID"`, "a string")
	e.wantError("POST", path, `{"snapshotID": "s"`, 400, "malformed JSON")
	e.wantError("POST", path, map[string]any{"snapshot": "s"}, 400, `unknown field "snapshot"`)
	e.wantError("POST", path, map[string]any{"snapshotID": strings.Repeat("x", 300)}, 400, `"snapshotID"`, "at most")
	e.wantError("POST", path, `{"snapshotID": "`+strings.Repeat("x", 5000)+`"}`, 413, "max_body_bytes")
	e.wantError("POST", path, map[string]any{"snapshotID": "nope"}, 404, `"snapshotID"`, "nope")
	e.wantError("POST", path, map[string]any{"snapshotID": "bad/ref"}, 404, `"snapshotID"`)
	e.wantError("POST", "/sandboxes/nope/rollback", map[string]any{"snapshotID": sn.SnapshotID}, 404, "nope")

	// While a rollback runs on the sandbox a second one, or a snapshot, is refused: 409.
	block := make(chan struct{})
	e.f.rollbackBlock = block
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		e.want("POST", path, map[string]any{"snapshotID": "s"}, 200, nil)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		e.s.busy.mu.Lock()
		busy := e.s.busy.m[id] != ""
		e.s.busy.mu.Unlock()
		if busy || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	e.wantError("POST", path, map[string]any{"snapshotID": "s"}, 409, "busy", "rollback")
	e.wantError("POST", "/sandboxes/"+id+"/snapshots", nil, 409, "busy")
	close(block)
	wg.Wait()
	e.f.rollbackBlock = nil
	_, b := e.do("GET", "/metrics", nil)
	if !strings.Contains(string(b), `cube_api_rollback_duration_seconds_count{result="ok"} 1`) {
		t.Errorf("metrics:\n%s", b)
	}
}

// TestShimBusyIsConflict: the shim's "busy" (Unavailable: a snapshot or
// rollback started elsewhere, e.g. by the cube CLI) is a 409 too.
func TestShimBusyIsConflict(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(nil).SandboxID
	e.snapshot(id, "s")
	e.f.rollbackErr = busyErr(id)
	e.wantError("POST", "/sandboxes/"+id+"/rollback", map[string]any{"snapshotID": "s"}, http.StatusConflict, "busy")
	_, b := e.do("GET", "/metrics", nil)
	if !strings.Contains(string(b), `cube_api_rollback_duration_seconds_count{result="error"} 1`) {
		t.Errorf("metrics:\n%s", b)
	}
}

func TestForkValidation(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(nil).SandboxID
	path := "/sandboxes/" + id + "/fork"
	e.wantError("POST", path, map[string]any{"count": 0}, 400, `"count"`, "1..100")
	e.wantError("POST", path, map[string]any{"count": 101}, 400, `"count"`)
	e.wantError("POST", path, map[string]any{"count": "2"}, 400, `"count"`, "a number")
	e.wantError("POST", path, map[string]any{"count": 2, "timeout": -1}, 400, `"timeout"`)
	e.wantError("POST", "/sandboxes/nope/fork", map[string]any{"count": 2}, 404)
	e.wantError("POST", path, map[string]any{"count": 2, "allOrNothing": "yes"}, 400, `"allOrNothing"`)
	if n := len(e.f.ctrs); n != 1 {
		t.Errorf("%d sandboxes after refused forks, want 1", n)
	}
}
