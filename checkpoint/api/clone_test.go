package api

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/checkpoint/clone"
)

// TestCreateFromSnapshot: a snapshot id or name as templateID restores the
// sandbox's VM (its processes run again) as a new sandbox with the API's
// labels and the request's environment added to the snapshot's; the
// snapshot is held while the new sandbox lives.
func TestCreateFromSnapshot(t *testing.T) {
	e := newEnv(t, nil)
	src := e.create(map[string]any{"envVars": map[string]string{"A": "1"}})
	start, _, stop := e.startStream(src.SandboxID, `{"cmd":"sleep"}`)
	defer stop()
	sn := e.snapshot(src.SandboxID, "base")
	e.want("DELETE", "/sandboxes/"+src.SandboxID, nil, 204, nil)

	for _, ref := range []string{"base", sn.SnapshotID} {
		sb := e.create(map[string]any{"templateID": ref, "metadata": map[string]string{"k": "v"}, "envVars": map[string]string{"B": "2"}, "timeout": 30})
		if sb.SandboxID == src.SandboxID || sb.TemplateID != ref || sb.State != "running" || sb.Metadata["k"] != "v" || sb.Timeout != 30 {
			t.Errorf("from %s: %+v", ref, sb)
		}
		e.f.mu.Lock()
		c, spec, from := e.f.ctrs[sb.SandboxID], e.f.specs[sb.SandboxID], e.f.madeFrom[sb.SandboxID]
		e.f.mu.Unlock()
		if c.Labels[clone.LabelRestoredFrom] != sn.SnapshotID || c.Labels[LabelSandbox] != "1" || snapIDOf(from) != sn.SnapshotID {
			t.Errorf("from %s: labels %v, made from %s", ref, c.Labels, from)
		}
		if !slices.Contains(spec.Env, "A=1") || !slices.Contains(spec.Env, "B=2") {
			t.Errorf("from %s: env %v, want A=1 (the snapshot's) and B=2 (the request's)", ref, spec.Env)
		}
		// The command that ran at the snapshot runs in the new sandbox.
		e.waitCommands(sb.SandboxID, func(l []CommandInfo) bool { return len(l) == 1 && l[0].Pid == start.Pid })
		// Held while the sandbox lives.
		e.wantError("DELETE", "/snapshots/"+sn.SnapshotID, nil, 409, "in use")
		e.want("DELETE", "/sandboxes/"+sb.SandboxID, nil, 204, nil)
	}
	e.want("DELETE", "/snapshots/base", nil, 204, nil)
	e.wantError("POST", "/sandboxes", map[string]any{"templateID": "base"}, 404, "unknown template", `"base"`)

	// A restore that fails leaves no sandbox and no reference.
	sn2 := e.snapshot(e.create(nil).SandboxID, "two")
	e.f.makeErr[e.f.makes+1] = fmt.Errorf("no kvm: %w", errdefs.ErrUnavailable)
	e.wantError("POST", "/sandboxes", map[string]any{"templateID": "two"}, 503, "no kvm")
	if n := len(e.f.ctrs); n != 1 {
		t.Errorf("%d sandboxes after a failed restore, want 1", n)
	}
	e.want("DELETE", "/snapshots/"+sn2.SnapshotID, nil, 204, nil)
}

// snapshotsLeft is the store's snapshot count.
func (e *env) snapshotsLeft() int {
	e.t.Helper()
	var l []SnapshotInfo
	e.want("GET", "/snapshots", nil, 200, &l)
	return len(l)
}

func TestFork(t *testing.T) {
	e := newEnv(t, nil)
	src := e.create(map[string]any{"metadata": map[string]string{"team": "a"}})
	start, _, stop := e.startStream(src.SandboxID, `{"cmd":"sleep"}`)
	defer stop()
	var items []ForkItem
	e.want("POST", "/sandboxes/"+src.SandboxID+"/fork", map[string]any{"count": 2, "timeout": 60}, http.StatusOK, &items)
	if len(items) != 2 {
		t.Fatalf("fork: %+v", items)
	}
	seen := map[string]bool{src.SandboxID: true}
	for i, it := range items {
		if it.Error != nil || it.Sandbox == nil {
			t.Fatalf("item %d: %+v", i, it)
		}
		sb := it.Sandbox
		if seen[sb.SandboxID] || sb.State != "running" || sb.Metadata["team"] != "a" || sb.Timeout != 60 || sb.TemplateID != src.TemplateID {
			t.Errorf("item %d: %+v", i, sb)
		}
		seen[sb.SandboxID] = true
		e.f.mu.Lock()
		lb := e.f.ctrs[sb.SandboxID].Labels
		e.f.mu.Unlock()
		if lb[clone.LabelForkedFrom] != src.SandboxID || lb[clone.LabelFork] == "" {
			t.Errorf("item %d: labels %v", i, lb)
		}
		e.waitCommands(sb.SandboxID, func(l []CommandInfo) bool { return len(l) == 1 && l[0].Pid == start.Pid })
	}
	// The temporary snapshot is gone; the source runs on.
	if n := e.snapshotsLeft(); n != 0 {
		t.Errorf("%d snapshots after a fork, want 0", n)
	}
	var sb Sandbox
	e.want("GET", "/sandboxes/"+src.SandboxID, nil, 200, &sb)
	if sb.State != "running" {
		t.Errorf("source after the fork: %+v", sb)
	}
}

// TestForkFailures: without allOrNothing a failed clone is an error item
// beside the others; with it, the ones made are deleted and every item says
// why. The temporary snapshot is deleted either way.
func TestForkFailures(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(nil).SandboxID
	path := "/sandboxes/" + id + "/fork"

	e.f.makeErr[e.f.makes+2] = fmt.Errorf("out of memory: %w", errdefs.ErrResourceExhausted)
	var items []ForkItem
	e.want("POST", path, map[string]any{"count": 3}, http.StatusOK, &items)
	if len(items) != 3 || items[0].Sandbox == nil || items[1].Error == nil || items[2].Sandbox == nil {
		t.Fatalf("partial fork: %+v", items)
	}
	if items[1].Error.Code != 500 || !strings.Contains(items[1].Error.Message, "out of memory") {
		t.Errorf("failed item: %+v", items[1].Error)
	}
	if n := len(e.f.ctrs); n != 3 {
		t.Errorf("%d sandboxes after a partial fork, want 3", n)
	}
	for _, it := range []ForkItem{items[0], items[2]} {
		e.want("DELETE", "/sandboxes/"+it.Sandbox.SandboxID, nil, 204, nil)
	}

	e.f.makeErr[e.f.makes+2] = fmt.Errorf("no kvm: %w", errdefs.ErrUnavailable)
	items = nil
	e.want("POST", path, map[string]any{"count": 3, "allOrNothing": true}, http.StatusOK, &items)
	if len(items) != 3 {
		t.Fatalf("all or nothing: %+v", items)
	}
	for i, want := range []string{"then deleted", "no kvm", "not made"} {
		if items[i].Sandbox != nil || items[i].Error == nil || !strings.Contains(items[i].Error.Message, want) {
			t.Errorf("all or nothing, item %d: %+v, want an error with %q", i, items[i], want)
		}
	}
	if n := len(e.f.ctrs); n != 1 {
		t.Errorf("%d sandboxes after a failed all-or-nothing fork, want 1 (the source)", n)
	}
	if n := e.snapshotsLeft(); n != 0 {
		t.Errorf("%d snapshots after forks, want 0", n)
	}
	// A fork that cannot snapshot is an error, not items.
	e.f.failErr = fmt.Errorf("containerd is gone: %w", errdefs.ErrUnavailable)
	e.wantError("POST", path, map[string]any{"count": 1}, 503, "containerd is gone")
}

// A command that came with the snapshot is killable in the restored sandbox at once, without a list of its
// commands before (the kill adopts it from the guest's processes as the list does).
func TestKillRestoredCommandWithoutList(t *testing.T) {
	e := newEnv(t, nil)
	src := e.create(nil)
	start, _, stop := e.startStream(src.SandboxID, `{"cmd":"sleep"}`)
	defer stop()
	e.snapshot(src.SandboxID, "base")
	sb := e.create(map[string]any{"templateID": "base"})
	path := fmt.Sprintf("/sandboxes/%s/commands/%d", sb.SandboxID, start.Pid)
	e.wantError("POST", path+"/stdin", map[string]any{"data": "x"}, 409, "stdin")
	e.want("POST", path+"/kill", map[string]any{"signal": "SIGKILL"}, 204, nil)
	e.waitCommands(sb.SandboxID, func(l []CommandInfo) bool { return len(l) == 0 })
	e.wantError("POST", path+"/kill", nil, 404, "no running command")
	e.wantError("POST", fmt.Sprintf("/sandboxes/%s/commands/%d/kill", sb.SandboxID, start.Pid+1000), nil, 404, "no running command")
}
