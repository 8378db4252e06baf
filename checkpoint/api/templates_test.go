package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestTemplates: build (a sandbox booted, readyCmd run, snapshot under the
// template's names, the build sandbox deleted), list, get, create a
// sandbox from it (restored), delete (409 while a sandbox from it runs);
// templates are in the store, so a new server over it lists them.
func TestTemplates(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.SandboxCommand = []string{"sleep"} })
	var tp TemplateInfo
	e.want("POST", "/templates", map[string]any{"templateID": "py", "image": "docker.io/library/busybox:latest",
		"readyCmd": []string{"echo", "ok"}, "envVars": map[string]string{"T": "1"}}, http.StatusCreated, &tp)
	if tp.TemplateID != "py" || len(tp.SnapshotID) != 24 || tp.Image != "docker.io/library/busybox:latest" || tp.InUse || tp.BuildMs <= 0 {
		t.Errorf("built: %+v", tp)
	}
	if n := len(e.f.ctrs); n != 0 {
		t.Errorf("%d sandboxes after the build, want 0 (the build sandbox is deleted)", n)
	}
	// A generated id; a snapshot that is no template is not listed.
	var tp2 TemplateInfo
	e.want("POST", "/templates", map[string]any{"image": "docker.io/library/busybox:latest"}, http.StatusCreated, &tp2)
	if !strings.HasPrefix(tp2.TemplateID, "tpl-") {
		t.Errorf("generated id: %+v", tp2)
	}
	e.snapshot(e.create(nil).SandboxID, "plain")
	var l []TemplateInfo
	e.want("GET", "/templates", nil, 200, &l)
	if len(l) != 2 || l[0].TemplateID != "py" || l[1].TemplateID != tp2.TemplateID {
		t.Errorf("list: %+v", l)
	}
	e.wantError("GET", "/templates/plain", nil, 404, `no template "plain"`)
	// E2B's SDK deletes a snapshot with DELETE /templates/{id}: a plain snapshot goes too.
	e.want("DELETE", "/templates/plain", nil, 204, nil)
	e.wantError("GET", "/snapshots/plain", nil, 404)
	e.wantError("DELETE", "/templates/plain", nil, 404, `no template "plain"`)

	// Sandbox.create(template=ID) restores it.
	sb := e.create(map[string]any{"templateID": "py"})
	e.f.mu.Lock()
	spec := e.f.specs[sb.SandboxID]
	from := e.f.madeFrom[sb.SandboxID]
	e.f.mu.Unlock()
	if sb.TemplateID != "py" || snapIDOf(from) != tp.SnapshotID || !strings.Contains(strings.Join(spec.Env, " "), "T=1") {
		t.Errorf("from the template: %+v, made from %s, env %v", sb, from, spec.Env)
	}
	var got TemplateInfo
	e.want("GET", "/templates/py", nil, 200, &got)
	if !got.InUse || got.SnapshotID != tp.SnapshotID {
		t.Errorf("get: %+v", got)
	}
	e.wantError("DELETE", "/templates/py", nil, 409, "in use")
	e.want("DELETE", "/sandboxes/"+sb.SandboxID, nil, 204, nil)

	// Another server over the same store (a restart of cube-api) lists them.
	s2, err := New(DefaultConfig(), nil, e.f, e.st, Options{})
	if err != nil {
		t.Fatal(err)
	}
	e2 := &env{t: t, f: e.f, st: e.st, s: s2, srv: httptestServer(t, s2)}
	e2.want("GET", "/templates", nil, 200, &l)
	if len(l) != 2 {
		t.Errorf("after a restart: %+v", l)
	}
	e2.want("DELETE", "/templates/py", nil, 204, nil)
	e2.want("DELETE", "/templates/"+tp2.TemplateID, nil, 204, nil)
	e2.wantError("POST", "/sandboxes", map[string]any{"templateID": "py"}, 404, "unknown template")
	e2.want("GET", "/templates", nil, 200, &l)
	if len(l) != 0 {
		t.Errorf("after deletes: %+v", l)
	}
}

func TestTemplateBuildErrors(t *testing.T) {
	e := newEnv(t, nil)
	img := "docker.io/library/busybox:latest"
	e.wantError("POST", "/templates", map[string]any{}, 400, `"image" is required`)
	e.wantError("POST", "/templates", map[string]any{"image": "nope:1"}, 404, `"image"`, "nope:1")
	e.wantError("POST", "/templates", map[string]any{"image": img, "templateID": "bad/id"}, 400, `"templateID"`)
	e.wantError("POST", "/templates", map[string]any{"image": img, "templateID": "cube-template.x"}, 400, `"templateID"`)
	e.wantError("POST", "/templates", map[string]any{"image": img, "readyTimeout": -1}, 400, `"readyTimeout"`)
	e.wantError("POST", "/templates", map[string]any{"image": img, "readyCmd": "true"}, 400, `"readyCmd"`)
	e.wantError("POST", "/templates", map[string]any{"image": img, "envVars": map[string]string{"A=B": "1"}}, 400, `"envVars"`)
	// Never ready: 504 naming the command and its last exit; nothing left.
	e.wantError("POST", "/templates", map[string]any{"image": img, "readyCmd": []string{"fail"}, "readyTimeout": 1}, 504, "not ready", "exit code 3")
	if n := len(e.f.ctrs); n != 0 || e.snapshotsLeft() != 0 {
		t.Errorf("after a failed build: %d sandboxes, %d snapshots", n, e.snapshotsLeft())
	}
	// A taken id: 409.
	e.want("POST", "/templates", map[string]any{"image": img, "templateID": "t1"}, 201, nil)
	e.wantError("POST", "/templates", map[string]any{"image": img, "templateID": "t1"}, 409, `"t1"`)
}

func httptestServer(t *testing.T, s *Server) *httptest.Server {
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return srv
}
