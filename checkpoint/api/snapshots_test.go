package api

import (
	"context"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cube-runtime/cube/checkpoint/store"
)

// snapshot takes a snapshot of sandbox id through the API.
func (e *env) snapshot(id, name string) SnapshotInfo {
	e.t.Helper()
	var body any
	if name != "" {
		body = map[string]any{"name": name}
	}
	var s SnapshotInfo
	e.want("POST", "/sandboxes/"+id+"/snapshots", body, 201, &s)
	return s
}

func TestSnapshots(t *testing.T) {
	e := newEnv(t, nil)
	a, b := e.create(nil).SandboxID, e.create(nil).SandboxID
	s1 := e.snapshot(a, "first")
	if len(s1.SnapshotID) != 24 || strings.Join(s1.Names, ",") != "first" || s1.SandboxID != a || s1.Kind != "full" ||
		s1.SizeBytes <= 0 || s1.FrozenMs != 1.5 || s1.TotalMs != 7 || s1.InUse {
		t.Fatalf("created %+v", s1)
	}
	s2 := e.snapshot(a, "")
	s3 := e.snapshot(b, "other")
	if len(s2.Names) != 0 || s2.Names == nil {
		t.Errorf("unnamed: %+v", s2)
	}
	for _, ref := range []string{s1.SnapshotID, "first"} {
		var got SnapshotInfo
		e.want("GET", "/snapshots/"+ref, nil, 200, &got)
		if got.SnapshotID != s1.SnapshotID || got.FrozenMs != 0 {
			t.Errorf("get %s: %+v", ref, got)
		}
	}
	var l []SnapshotInfo
	e.want("GET", "/snapshots", nil, 200, &l)
	if len(l) != 3 {
		t.Fatalf("list: %+v", l)
	}
	e.want("GET", "/snapshots?sandboxID="+a, nil, 200, &l)
	if len(l) != 2 || l[0].SnapshotID != s1.SnapshotID || l[1].SnapshotID != s2.SnapshotID {
		t.Errorf("sandbox a's: %+v", l)
	}
	h := e.want("GET", "/snapshots?limit=2", nil, 200, &l)
	tok := h.Get(NextTokenHeader)
	if len(l) != 2 || tok == "" {
		t.Fatalf("page 1: %d, token %q", len(l), tok)
	}
	h = e.want("GET", "/snapshots?limit=2&nextToken="+url.QueryEscape(tok), nil, 200, &l)
	if len(l) != 1 || l[0].SnapshotID != s3.SnapshotID || h.Get(NextTokenHeader) != "" {
		t.Errorf("page 2: %+v, token %q", l, h.Get(NextTokenHeader))
	}
	e.wantError("GET", "/snapshots?nextToken=%21bad", nil, 400, `"nextToken"`)
	e.wantError("GET", "/snapshots?limit=-1", nil, 400, `"limit"`)

	// Snapshots outlive their sandbox.
	e.want("DELETE", "/sandboxes/"+a, nil, 204, nil)
	e.want("GET", "/snapshots/first", nil, 200, nil)

	// In use: 409 naming the holder; released: deleted.
	if err := e.st.Acquire(context.Background(), s1.SnapshotID, store.Holder{Name: "sandbox clone1"}); err != nil {
		t.Fatal(err)
	}
	var held SnapshotInfo
	e.want("GET", "/snapshots/"+s1.SnapshotID, nil, 200, &held)
	if !held.InUse {
		t.Errorf("held snapshot not in use: %+v", held)
	}
	e.wantError("DELETE", "/snapshots/first", nil, 409, "in use", "sandbox clone1")
	if err := e.st.Release(context.Background(), s1.SnapshotID, "sandbox clone1"); err != nil {
		t.Fatal(err)
	}
	e.want("DELETE", "/snapshots/first", nil, 204, nil)
	e.wantError("GET", "/snapshots/first", nil, 404)
	e.wantError("GET", "/snapshots/"+s1.SnapshotID, nil, 404)
	e.wantError("DELETE", "/snapshots/"+s1.SnapshotID, nil, 404)
	e.wantError("GET", "/snapshots/no%20such", nil, 404)
}

func TestSnapshotErrors(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(nil).SandboxID
	e.snapshot(id, "taken")
	e.wantError("POST", "/sandboxes/"+id+"/snapshots", map[string]any{"name": "taken"}, 409, "taken")
	e.wantError("POST", "/sandboxes/"+id+"/snapshots", map[string]any{"name": "-bad name"}, 400, `"name"`)
	e.wantError("POST", "/sandboxes/"+id+"/snapshots", map[string]any{"name": 5}, 400, `"name"`, "want a string")
	e.wantError("POST", "/sandboxes/"+id+"/snapshots", map[string]any{"names": []string{"x"}}, 400, `unknown field "names"`)
	e.wantError("POST", "/sandboxes/nope/snapshots", nil, 404, "nope")

	// A second snapshot while one runs: 409, the first completes.
	block := make(chan struct{})
	e.f.snapBlock = block
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		e.snapshot(id, "slow")
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		e.f.mu.Lock()
		busy := e.f.snapping[id]
		e.f.mu.Unlock()
		if busy || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	e.wantError("POST", "/sandboxes/"+id+"/snapshots", nil, 409, "busy")
	close(block)
	wg.Wait()
	e.f.snapBlock = nil
	e.want("GET", "/snapshots/slow", nil, 200, nil)
}
