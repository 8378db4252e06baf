package api

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

const testKey = "k-0123456789abcdef"

func TestAuth(t *testing.T) {
	e := newEnv(t, nil, testKey)
	e.key = ""
	e.wantError("GET", "/sandboxes", nil, 401, "missing API key")
	for _, h := range [][]string{{"Authorization", "Bearer wrong-key-0123456789"}, {"X-API-Key", "wrong"}, {"Authorization", "Basic " + testKey}} {
		resp, b := e.do("GET", "/sandboxes", nil, h...)
		if resp.StatusCode != 401 {
			t.Errorf("%v: %d %s", h, resp.StatusCode, b)
		}
	}
	for _, h := range [][]string{{"Authorization", "Bearer " + testKey}, {"X-API-Key", testKey}} {
		if resp, b := e.do("GET", "/sandboxes", nil, h...); resp.StatusCode != 200 {
			t.Errorf("%v: %d %s", h, resp.StatusCode, b)
		}
	}
	// Public: health and the OpenAPI document.
	for _, p := range []string{"/health", "/openapi.json"} {
		if resp, _ := e.do("GET", p, nil); resp.StatusCode != 200 {
			t.Errorf("%s without a key: %d", p, resp.StatusCode)
		}
	}
	if resp, _ := e.do("GET", "/metrics", nil); resp.StatusCode != 401 {
		t.Errorf("/metrics without a key: %d", resp.StatusCode)
	}
}

func TestCheckAuth(t *testing.T) {
	for _, l := range []string{"127.0.0.1:3000", "[::1]:3000", "localhost:1"} {
		if err := CheckAuth(l, nil); err != nil {
			t.Errorf("%s: %v", l, err)
		}
	}
	for _, l := range []string{"0.0.0.0:3000", ":3000", "10.0.0.1:80", "[::]:80"} {
		if err := CheckAuth(l, nil); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "api_keys") {
			t.Errorf("%s without a key: %v", l, err)
		}
		if err := CheckAuth(l, []string{testKey}); err != nil {
			t.Errorf("%s with a key: %v", l, err)
		}
	}
}

func TestRequestIDAndUnknownRoute(t *testing.T) {
	e := newEnv(t, nil)
	resp, _ := e.do("GET", "/health", nil, "X-Request-Id", "abc-123")
	if resp.Header.Get("X-Request-Id") != "abc-123" {
		t.Errorf("request id not kept: %q", resp.Header.Get("X-Request-Id"))
	}
	resp, _ = e.do("GET", "/sandboxes/nope", nil, "X-Request-Id", strings.Repeat("x", 65))
	id := resp.Header.Get("X-Request-Id")
	if len(id) != 16 || !strings.Contains(e.logs.String(), "request_id="+id) {
		t.Errorf("fresh id %q; logs:\n%s", id, e.logs)
	}
	e.wantError("GET", "/nope", nil, 404, "no route GET /nope")
	e.wantError("PUT", "/sandboxes", nil, 404, "no route PUT /sandboxes")
	if resp, _ := e.do("GET", "/nope", nil); resp.Header.Get("X-Request-Id") == "" {
		t.Error("no request id on an unknown route")
	}
}

func TestMetrics(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(nil).SandboxID
	e.create(nil)
	e.want("POST", "/sandboxes/"+id+"/pause", nil, 204, nil)
	e.snapshot(id, "")
	e.do("GET", "/sandboxes/nope", nil)
	_, b := e.do("GET", "/metrics", nil)
	for _, want := range []string{
		`cube_api_requests_total{code="201",route="POST /sandboxes"} 2`,
		`cube_api_requests_total{code="404",route="GET /sandboxes/{sandboxID}"} 1`,
		`cube_api_request_duration_seconds_count{route="POST /sandboxes/{sandboxID}/pause"} 1`,
		`cube_api_sandboxes{state="running"} 1`, `cube_api_sandboxes{state="paused"} 1`,
		`cube_api_snapshot_duration_seconds_count{result="ok"} 1`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestOpenAPIMatchesRoutes(t *testing.T) {
	var doc struct {
		OpenAPI string                    `json:"openapi"`
		Paths   map[string]map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(OpenAPI, &doc); err != nil || !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi.json: %v (version %q)", err, doc.OpenAPI)
	}
	var inDoc, served []string
	for p, ops := range doc.Paths {
		for m := range ops {
			if m != "parameters" {
				inDoc = append(inDoc, strings.ToUpper(m)+" "+p)
			}
		}
	}
	e := newEnv(t, nil)
	for _, rt := range e.s.routes {
		served = append(served, rt.Method+" "+rt.Path)
	}
	sort.Strings(inDoc)
	sort.Strings(served)
	if strings.Join(inDoc, "\n") != strings.Join(served, "\n") {
		t.Errorf("openapi.json and the router differ:\ndocument:\n%s\n\nrouter:\n%s", strings.Join(inDoc, "\n"), strings.Join(served, "\n"))
	}
	// Every route answers something other than "no route".
	for _, rt := range e.s.routes {
		p := strings.NewReplacer("{sandboxID}", "x", "{snapshotID}", "x", "{templateID}", "x", "{pid}", "1").Replace(rt.Path)
		resp, b := e.do(rt.Method, p, nil)
		if strings.Contains(string(b), "no route") {
			t.Errorf("%s %s: %d %s", rt.Method, p, resp.StatusCode, b)
		}
	}
	var served2 map[string]any
	e.want("GET", "/openapi.json", nil, 200, &served2)
}

func TestConfig(t *testing.T) {
	c, err := ParseConfig([]byte("listen = \"0.0.0.0:8080\"\nnamespace = \"ns1\"\napi_keys = [\"" + testKey + "\"]\nrequest_timeout = \"10s\"\n"))
	if err != nil || c.Listen != "0.0.0.0:8080" || c.Namespace != "ns1" || c.Runtime != DefaultRuntime || c.Snapshotter != "cube" || c.RequestTimeout != "10s" {
		t.Fatalf("%+v %v", c, err)
	}
	for in, want := range map[string]string{
		"lissten = \"x\"":                  "lissten",
		"listen = \"nohost\"":              "listen",
		"request_timeout = \"soon\"":       "request_timeout",
		"max_body_bytes = 0":               "max_body_bytes",
		"api_keys = [\"short\"]":           "api_keys",
		"default_sandbox_timeout = 100000": "default_sandbox_timeout",
		"namespace = \"\"":                 "namespace",
		"listen = 5":                       "Listen",
	} {
		if _, err := ParseConfig([]byte(in)); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", in, err)
		}
	}
	dir := t.TempDir()
	kf := filepath.Join(dir, "keys")
	os.WriteFile(kf, []byte("# keys\n"+testKey+"\n\n"), 0o600)
	c = DefaultConfig()
	c.APIKeysFile = kf
	if keys, err := c.Keys(); err != nil || len(keys) != 1 || keys[0] != testKey {
		t.Errorf("keys file: %v %v", keys, err)
	}
	if _, err := LoadConfig(filepath.Join(dir, "missing.toml")); err == nil {
		t.Error("a missing explicit config loaded")
	}
	os.WriteFile(filepath.Join(dir, "api.toml"), []byte("listen = \"127.0.0.1:0\"\n"), 0o600)
	if c, err := LoadConfig(filepath.Join(dir, "api.toml")); err != nil || c.Listen != "127.0.0.1:0" {
		t.Errorf("load: %+v %v", c, err)
	}
}

func TestServeShutdown(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(nil).SandboxID
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	errC := make(chan error, 1)
	go func() { errC <- e.s.Serve(ctx, ln, ready) }()
	addr := <-ready
	// A command stream is open while the daemon shuts down: it ends, the shutdown completes.
	e.srv.URL = "http://" + addr
	_, sc, done := e.startStream(id, `{"cmd":"sleep"}`)
	defer done()
	cancel()
	select {
	case err := <-errC:
		if err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no graceful shutdown")
	}
	if sc.Scan() {
		t.Errorf("stream went on: %q", sc.Text())
	}
	if _, err := http.Get("http://" + addr + "/health"); err == nil || errors.Is(err, context.Canceled) {
		t.Errorf("still serving after shutdown: %v", err)
	}
}
