package api

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"
)

func TestCreateGetDeleteSandbox(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.create(map[string]any{"timeout": 60, "metadata": map[string]string{"user": "ann"}, "envVars": map[string]string{"A": "1"}})
	if len(sb.SandboxID) != 20 || sb.State != "running" || sb.TemplateID != "docker.io/library/busybox:latest" ||
		sb.Metadata["user"] != "ann" || sb.Timeout != 60 || !sb.EndAt.Equal(e.now.Add(time.Minute)) || !sb.StartedAt.Equal(e.now) {
		t.Fatalf("created %+v", sb)
	}
	spec := e.f.specs[sb.SandboxID]
	if strings.Join(spec.Env, ",") != "A=1" || spec.Image != sb.TemplateID {
		t.Errorf("container spec %+v", spec)
	}
	var got Sandbox
	e.want("GET", "/sandboxes/"+sb.SandboxID, nil, 200, &got)
	if got.SandboxID != sb.SandboxID || got.Metadata["user"] != "ann" || !got.EndAt.Equal(sb.EndAt) {
		t.Errorf("get %+v, created %+v", got, sb)
	}
	e.want("DELETE", "/sandboxes/"+sb.SandboxID, nil, 204, nil)
	e.wantError("GET", "/sandboxes/"+sb.SandboxID, nil, 404, sb.SandboxID)
	e.wantError("DELETE", "/sandboxes/"+sb.SandboxID, nil, 404)
}

func TestCreateDefaultsAndErrors(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.DefaultTemplate = "docker.io/library/busybox:latest"
		c.SandboxCommand = []string{"sleep", "inf"}
	})
	var sb Sandbox
	e.want("POST", "/sandboxes", map[string]any{}, 201, &sb)
	if sb.Timeout != DefaultSandboxTimeout || sb.TemplateID != "docker.io/library/busybox:latest" {
		t.Errorf("defaults: %+v", sb)
	}
	if c := e.f.specs[sb.SandboxID].Command; strings.Join(c, " ") != "sleep inf" {
		t.Errorf("sandbox_command: %q", c)
	}
	e.wantError("POST", "/sandboxes", map[string]any{"templateID": "nope:latest"}, 404, "unknown template", "nope:latest")
	e.wantError("POST", "/sandboxes", map[string]any{"timeout": -1}, 400, `"timeout"`)
	e.wantError("POST", "/sandboxes", map[string]any{"timeout": DefaultMaxTimeout + 1}, 400, `"timeout"`, "max_sandbox_timeout")
	e.wantError("POST", "/sandboxes", map[string]any{"timeout": "10"}, 400, `"timeout"`, "want a number", "string")
	e.wantError("POST", "/sandboxes", map[string]any{"metadata": []string{"x"}}, 400, `"metadata"`, "an object")
	e.wantError("POST", "/sandboxes", map[string]any{"envVars": map[string]string{"A=B": "1"}}, 400, `"envVars"`)
	e.wantError("POST", "/sandboxes", map[string]any{"template": "x"}, 400, `unknown field "template"`)
	e.wantError("POST", "/sandboxes", map[string]any{"templateId": "x"}, 400, `unknown field "templateId"`, "case-sensitive", `"templateID"`)
	e.wantError("POST", "/sandboxes", map[string]any{"network": map[string]any{"allowout": []string{}}}, 400, `unknown field "allowout" in "network"`, `"allowOut"`)
	e.wantError("POST", "/sandboxes", `{"timeout": 10`, 400, "malformed JSON")
	e.wantError("POST", "/sandboxes", `{"timeout": 1x}`, 400, "malformed JSON at byte")
	e.wantError("POST", "/sandboxes", `{} {}`, 400, "data after the object")
	e.wantError("POST", "/sandboxes", `[1]`, 400, "want an object")
	e.wantError("POST", "/sandboxes", "", 400, "empty")
	e.wantError("POST", "/sandboxes", `{"metadata":{"k":"`+strings.Repeat("x", 5000)+`"}}`, 413, "max_body_bytes")
	big := map[string]string{}
	for i := 0; i < 175; i++ {
		big[fmt.Sprintf("key%03d", i)] = "0123456789"
	}
	e.wantError("POST", "/sandboxes", map[string]any{"metadata": big}, 400, `"metadata"`)

	// Without a default template the field is required.
	e2 := newEnv(t, nil)
	e2.wantError("POST", "/sandboxes", map[string]any{}, 400, `"templateID" is required`)
	// An unknown snapshot id or name: 404 naming it.
	e2.wantError("POST", "/sandboxes", map[string]any{"templateID": "0123456789abcdef01234567"}, 404, "unknown template", `"0123456789abcdef01234567"`)
	// The backend's failure is a 5xx with its message.
	e2.f.failErr = fmt.Errorf("containerd is gone: %w", errdefs.ErrUnavailable)
	e2.wantError("POST", "/sandboxes", map[string]any{"templateID": "docker.io/library/busybox:latest"}, 503, "containerd is gone")
	e2.wantError("GET", "/sandboxes", nil, 503, "containerd is gone")
}

func TestPauseResumeConnect(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(map[string]any{"timeout": 30}).SandboxID
	e.want("POST", "/sandboxes/"+id+"/pause", nil, 204, nil)
	var sb Sandbox
	e.want("GET", "/sandboxes/"+id, nil, 200, &sb)
	if sb.State != "paused" {
		t.Fatalf("after pause: %s", sb.State)
	}
	e.wantError("POST", "/sandboxes/"+id+"/pause", nil, 409, "paused")
	e.advance(time.Hour)
	e.want("POST", "/sandboxes/"+id+"/resume", map[string]any{"timeout": 100}, 201, &sb)
	if sb.State != "running" || !sb.EndAt.Equal(e.now.Add(100*time.Second)) || sb.Timeout != 100 {
		t.Errorf("resumed: %+v", sb)
	}
	e.wantError("POST", "/sandboxes/"+id+"/resume", nil, 409, "not paused")
	// connect to a running one: 200, the timeout restarts (the sandbox's own when none is given).
	e.advance(10 * time.Second)
	e.want("POST", "/sandboxes/"+id+"/connect", nil, 200, &sb)
	if !sb.EndAt.Equal(e.now.Add(100 * time.Second)) {
		t.Errorf("connect kept %v", sb.EndAt)
	}
	e.want("POST", "/sandboxes/"+id+"/pause", "", 204, nil)
	e.want("POST", "/sandboxes/"+id+"/connect", map[string]any{"timeout": 5}, 201, &sb)
	if sb.State != "running" || sb.Timeout != 5 {
		t.Errorf("connect to a paused one: %+v", sb)
	}
	e.wantError("POST", "/sandboxes/"+id+"/connect", map[string]any{"timeout": true}, 400, `"timeout"`)
	e.wantError("POST", "/sandboxes/"+id+"/pause", map[string]any{"x": 1}, 400, `unknown field "x"`)
	for _, op := range []string{"pause", "resume", "connect"} {
		e.wantError("POST", "/sandboxes/nope/"+op, nil, 404, "nope")
	}
	e.f.ctrs[id].Status = "stopped"
	e.wantError("POST", "/sandboxes/"+id+"/connect", nil, 409, "stopped")
}

func TestTimeoutAndRefresh(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(map[string]any{"timeout": 30}).SandboxID
	e.want("POST", "/sandboxes/"+id+"/timeout", map[string]any{"timeout": 600}, 204, nil)
	var sb Sandbox
	e.want("GET", "/sandboxes/"+id, nil, 200, &sb)
	if !sb.EndAt.Equal(e.now.Add(600*time.Second)) || sb.Timeout != 600 {
		t.Errorf("after timeout 600: %+v", sb)
	}
	// A refresh shorter than what is left changes nothing; a longer one extends.
	e.want("POST", "/sandboxes/"+id+"/refreshes", map[string]any{"duration": 60}, 204, nil)
	e.want("GET", "/sandboxes/"+id, nil, 200, &sb)
	if !sb.EndAt.Equal(e.now.Add(600 * time.Second)) {
		t.Errorf("a shorter refresh moved the deadline to %v", sb.EndAt)
	}
	e.want("POST", "/sandboxes/"+id+"/refreshes", map[string]any{"duration": 3600}, 204, nil)
	e.want("GET", "/sandboxes/"+id, nil, 200, &sb)
	if !sb.EndAt.Equal(e.now.Add(time.Hour)) {
		t.Errorf("refresh 3600: %v", sb.EndAt)
	}
	e.wantError("POST", "/sandboxes/"+id+"/timeout", map[string]any{}, 400, `"timeout"`)
	e.wantError("POST", "/sandboxes/"+id+"/timeout", nil, 400, "empty")
	e.wantError("POST", "/sandboxes/"+id+"/timeout", map[string]any{"timeout": 1e9}, 400, `"timeout"`)
	e.wantError("POST", "/sandboxes/nope/timeout", map[string]any{"timeout": 10}, 404)
}

func TestReaper(t *testing.T) {
	e := newEnv(t, nil)
	kill := e.create(map[string]any{"timeout": 10}).SandboxID
	pause := e.create(map[string]any{"timeout": 10, "autoPause": true}).SandboxID
	keep := e.create(map[string]any{"timeout": 100}).SandboxID
	e.s.Reap(context.Background())
	if len(e.f.ctrs) != 3 {
		t.Fatalf("reaped before the deadline: %d left", len(e.f.ctrs))
	}
	e.advance(11 * time.Second)
	e.s.Reap(context.Background())
	if e.f.ctrs[kill] != nil || e.f.ctrs[pause].Status != "paused" || e.f.ctrs[keep].Status != "running" {
		t.Fatalf("after the deadline: kill %v, pause %+v, keep %+v", e.f.ctrs[kill], e.f.ctrs[pause], e.f.ctrs[keep])
	}
	// A paused sandbox does not expire; resumed, its timeout starts again.
	e.advance(time.Hour)
	e.s.Reap(context.Background())
	if e.f.ctrs[pause] == nil || e.f.ctrs[keep] != nil {
		t.Fatalf("an hour later: pause %v, keep %v", e.f.ctrs[pause], e.f.ctrs[keep])
	}
	e.want("POST", "/sandboxes/"+pause+"/connect", nil, 201, nil)
	e.advance(5 * time.Second)
	e.s.Reap(context.Background())
	if e.f.ctrs[pause].Status != "running" {
		t.Errorf("resumed sandbox reaped early: %+v", e.f.ctrs[pause])
	}
	if !strings.Contains(e.logs.String(), "sandbox past its timeout killed") {
		t.Errorf("no log of the kill:\n%s", e.logs)
	}
	// A sandbox whose shim did not answer the list in time is left for the
	// next round, not killed blind; answering again, it is reaped.
	busy := e.create(map[string]any{"timeout": 10}).SandboxID
	e.f.ctrs[busy].Status = StatusUnknown
	e.advance(11 * time.Second)
	e.s.Reap(context.Background())
	if e.f.ctrs[busy] == nil || !strings.Contains(e.logs.String(), "its state is unknown") {
		t.Fatalf("reaper with an unknown state: %v; log:\n%s", e.f.ctrs[busy], e.logs)
	}
	e.f.ctrs[busy].Status = "running"
	e.s.Reap(context.Background())
	if e.f.ctrs[busy] != nil {
		t.Errorf("the busy sandbox, answering again, was not reaped")
	}
}

func TestListSandboxes(t *testing.T) {
	e := newEnv(t, nil)
	var ids []string
	for i := 0; i < 5; i++ {
		team := "a"
		if i%2 == 1 {
			team = "b"
		}
		ids = append(ids, e.create(map[string]any{"metadata": map[string]string{"team": team, "n": fmt.Sprint(i)}}).SandboxID)
		e.advance(time.Second)
	}
	e.want("POST", "/sandboxes/"+ids[2]+"/pause", nil, 204, nil)
	var all []Sandbox
	e.want("GET", "/sandboxes", nil, 200, &all)
	if len(all) != 5 || all[0].SandboxID != ids[0] || all[4].SandboxID != ids[4] {
		t.Fatalf("list: %+v", all)
	}
	var a []Sandbox
	e.want("GET", "/sandboxes?metadata="+url.QueryEscape("team=a"), nil, 200, &a)
	if len(a) != 3 {
		t.Errorf("team=a: %d", len(a))
	}
	e.want("GET", "/sandboxes?metadata="+url.QueryEscape("team=a&n=2"), nil, 200, &a)
	if len(a) != 1 || a[0].SandboxID != ids[2] {
		t.Errorf("team=a&n=2: %+v", a)
	}
	e.want("GET", "/v2/sandboxes?state=paused", nil, 200, &a)
	if len(a) != 1 || a[0].SandboxID != ids[2] || a[0].State != "paused" {
		t.Errorf("state=paused: %+v", a)
	}
	e.want("GET", "/v2/sandboxes?state=running,paused", nil, 200, &a)
	if len(a) != 5 {
		t.Errorf("state=running,paused: %d", len(a))
	}
	// Pages of 2: 2, 2, 1; the token in X-Next-Token, none after the last.
	var got []string
	token := ""
	for page := 0; ; page++ {
		var p []Sandbox
		q := "/v2/sandboxes?limit=2"
		if token != "" {
			q += "&nextToken=" + url.QueryEscape(token)
		}
		h := e.want("GET", q, nil, 200, &p)
		for _, sb := range p {
			got = append(got, sb.SandboxID)
		}
		if token = h.Get(NextTokenHeader); token == "" {
			break
		}
		if page > 5 {
			t.Fatal("no end of pages")
		}
	}
	if strings.Join(got, ",") != strings.Join(ids, ",") {
		t.Errorf("pages: %v, want %v", got, ids)
	}
	e.wantError("GET", "/sandboxes?limit=0", nil, 400, `"limit"`)
	e.wantError("GET", "/sandboxes?limit=x", nil, 400, `"limit"`)
	e.wantError("GET", "/sandboxes?state=dead", nil, 400, `"state"`)
	e.wantError("GET", "/sandboxes?nextToken=garbage", nil, 400, `"nextToken"`)
	e.wantError("GET", "/sandboxes?metadata="+url.QueryEscape("=x"), nil, 400, `"metadata"`)
	resp, b := e.do("GET", "/sandboxes?metadata="+url.QueryEscape("team=z"), nil)
	if resp.StatusCode != 200 || strings.TrimSpace(string(b)) != "[]" {
		t.Errorf("no match: %d %s", resp.StatusCode, b)
	}
}

// TestNotImplementedYet: a Backend that is no Restorer or Forker answers
// 501 for a create from a snapshot and a fork (the Containerd backend is
// both).
func TestNotImplementedYet(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(nil).SandboxID
	e.snapshot(id, "base")
	s, err := New(DefaultConfig(), nil, plainBackend{e.f}, e.st, Options{Log: logrus.New()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	plain := &env{t: t, f: e.f, st: e.st, s: s, srv: srv}
	plain.wantError("POST", "/sandboxes/"+id+"/fork", map[string]any{"count": 2}, http.StatusNotImplemented, "fork is not implemented yet")
	plain.wantError("POST", "/sandboxes", map[string]any{"templateID": "base"}, http.StatusNotImplemented, "not implemented yet")
}

// plainBackend hides the fake's Restore and Fork.
type plainBackend struct{ Backend }
