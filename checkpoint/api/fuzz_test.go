package api

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/checkpoint/store"
)

// FuzzRequests sends untrusted bodies and query strings to the routes that
// parse them (rollback, fork, snapshots, commands, files): whatever comes,
// the answer is a success or a {code, message} error below 500, and the
// daemon does not panic.
func FuzzRequests(f *testing.F) {
	st, err := store.Open(context.Background(), f.TempDir(), store.Options{})
	if err != nil {
		f.Fatal(err)
	}
	fb := newFake(st)
	fb.DirFiles = &DirFiles{Root: f.TempDir()}
	cfg := DefaultConfig()
	cfg.MaxBodyBytes, cfg.MaxFileBytes = 4096, 4096
	// A template's readyTimeout is at most request_timeout: a build never
	// ready ends soon (504).
	cfg.RequestTimeout = "2s"
	log := logrus.New()
	log.SetOutput(io.Discard)
	s, err := New(cfg, nil, fb, st, Options{Log: log})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(s.Stop)
	h := s.Handler()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/sandboxes", strings.NewReader(`{"templateID":"docker.io/library/busybox:latest"}`)))
	var sb Sandbox
	if err := json.Unmarshal(rec.Body.Bytes(), &sb); err != nil {
		f.Fatal(rec.Body.String())
	}
	routes := []string{"POST rollback", "POST fork", "POST snapshots", "GET files", "PUT files", "DELETE files",
		"GET files/stat", "GET files/list", "POST files/dir", "POST commands/1/kill", "POST /templates", "DELETE /templates/t"}
	for _, seed := range []struct {
		route       uint8
		query, body string
	}{
		{0, "", `{"snapshotID":"x"}`}, {1, "", `{"count":3,"timeout":5}`}, {2, "", `{"name":"n"}`},
		{3, "path=/a&offset=1&length=2", ""}, {4, "path=/a&mode=0600&append=true", "data"},
		{5, "path=/a&recursive=true", ""}, {6, "path=/", ""}, {7, "path=/&limit=2&nextToken=a", ""},
		{8, "path=/d/e&mode=700", ""}, {9, "", `{"signal":"SIGTERM"}`}, {0, "", `{"snapshotID":`}, {3, "path=%FF", ""},
		{10, "", `{"image":"docker.io/library/busybox:latest","templateID":"t","readyCmd":["echo"],"readyTimeout":1}`},
		{10, "", `{"image":"docker.io/library/busybox:latest","readyCmd":["fail"],"readyTimeout":1}`}, {11, "", ""},
	} {
		f.Add(seed.route, seed.query, seed.body)
	}
	f.Fuzz(func(t *testing.T, route uint8, query, body string) {
		mp := strings.SplitN(routes[int(route)%len(routes)], " ", 2)
		if strings.ContainsAny(query, "# \r\n\t") {
			return // not a query string a client can send
		}
		path := "/sandboxes/" + sb.SandboxID + "/" + mp[1]
		if strings.HasPrefix(mp[1], "/") {
			path = mp[1]
		}
		req := httptest.NewRequest(mp[0], path, strings.NewReader(body))
		req.URL.RawQuery = query
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		neverReady := mp[1] == "/templates" && rec.Code == http.StatusGatewayTimeout && strings.Contains(rec.Body.String(), "not ready")
		if rec.Code >= 500 && rec.Code != http.StatusNotImplemented && !neverReady {
			t.Fatalf("%s ?%q %q: %d %s", routes[int(route)%len(routes)], query, body, rec.Code, rec.Body)
		}
		if rec.Code >= 400 {
			var e Error
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Code != rec.Code || e.Message == "" {
				t.Fatalf("%s: error body %q", routes[int(route)%len(routes)], rec.Body)
			}
		}
	})
}
