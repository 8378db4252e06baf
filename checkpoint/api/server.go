package api

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"
)

// Server serves the API over a Backend and a snapshot store.
type Server struct {
	cfg     Config
	dur     Durations
	keys    [][]byte
	be      Backend
	st      Snapshots
	log     *logrus.Logger
	metrics *metrics
	cmds    *commands
	busy    *busySandboxes
	mux     *http.ServeMux
	envd    http.Handler // E2B's envd protocol (envd.go)
	routes  []route
	now     func() time.Time
	// stop ends every command output stream (graceful shutdown).
	stop     chan struct{}
	stopOnce sync.Once
}

// BodyTimeout bounds reading a request's body.
const BodyTimeout = time.Minute

// Options are New's optional parts.
type Options struct {
	Log *logrus.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// route is one (method, path) the server serves.
type route struct {
	Method, Path string
	h            func(http.ResponseWriter, *http.Request) error
	// Stream: its response is a stream (no request timeout).
	Stream bool
	// Public: no API key needed.
	Public bool
	// FileBody: its body is a file's contents, bounded by max_file_bytes
	// (else max_body_bytes).
	FileBody bool
}

// New makes a server; keys are the API keys (none: no auth).
func New(cfg Config, keys []string, be Backend, st Snapshots, o Options) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dur, _ := cfg.Durations()
	s := &Server{cfg: cfg, dur: dur, be: be, st: st, log: o.Log, now: o.Now, mux: http.NewServeMux(),
		cmds: newCommands(), busy: newBusySandboxes(), stop: make(chan struct{})}
	if s.log == nil {
		s.log = logrus.StandardLogger()
	}
	if s.now == nil {
		s.now = time.Now
	}
	for _, k := range keys {
		s.keys = append(s.keys, []byte(k))
	}
	s.metrics = newMetrics(s)
	s.envd = s.envdHandler()
	s.routes = s.routeTable()
	for _, rt := range s.routes {
		s.mux.Handle(rt.Method+" "+rt.Path, s.wrap(rt))
	}
	// Anything else: 404, with a request id, logged and counted (route "* /").
	s.mux.Handle("/", s.wrap(route{Method: "*", Path: "/", Public: true, h: func(w http.ResponseWriter, r *http.Request) error {
		return fmt.Errorf("no route %s %s (GET /openapi.json lists them): %w", r.Method, r.URL.Path, errdefs.ErrNotFound)
	}}))
	return s, nil
}

// routeTable is every route; the OpenAPI document lists exactly these.
func (s *Server) routeTable() []route {
	return []route{
		{Method: "GET", Path: "/health", h: s.health, Public: true},
		{Method: "GET", Path: "/metrics", h: s.serveMetrics},
		{Method: "GET", Path: "/openapi.json", h: serveOpenAPI, Public: true},
		{Method: "POST", Path: "/sandboxes", h: s.createSandbox},
		{Method: "POST", Path: "/v2/sandboxes", h: s.createSandbox},
		{Method: "GET", Path: "/sandboxes", h: s.listSandboxes},
		{Method: "GET", Path: "/v2/sandboxes", h: s.listSandboxes},
		{Method: "GET", Path: "/sandboxes/{sandboxID}", h: s.getSandbox},
		{Method: "DELETE", Path: "/sandboxes/{sandboxID}", h: s.deleteSandbox},
		{Method: "POST", Path: "/sandboxes/{sandboxID}/pause", h: s.pauseSandbox},
		{Method: "POST", Path: "/sandboxes/{sandboxID}/resume", h: s.resumeSandbox},
		{Method: "POST", Path: "/sandboxes/{sandboxID}/connect", h: s.connectSandbox},
		{Method: "POST", Path: "/v2/sandboxes/{sandboxID}/connect", h: s.connectSandbox},
		{Method: "POST", Path: "/sandboxes/{sandboxID}/timeout", h: s.setTimeout},
		{Method: "POST", Path: "/sandboxes/{sandboxID}/refreshes", h: s.refresh},
		{Method: "POST", Path: "/sandboxes/{sandboxID}/rollback", h: s.rollback},
		{Method: "POST", Path: "/sandboxes/{sandboxID}/fork", h: s.fork},
		{Method: "PUT", Path: "/sandboxes/{sandboxID}/network", h: s.setNetwork},
		{Method: "POST", Path: "/sandboxes/{sandboxID}/snapshots", h: s.createSnapshot},
		{Method: "GET", Path: "/snapshots", h: s.listSnapshots},
		{Method: "GET", Path: "/snapshots/{snapshotID}", h: s.getSnapshot},
		{Method: "DELETE", Path: "/snapshots/{snapshotID}", h: s.deleteSnapshot},
		{Method: "POST", Path: "/templates", h: s.buildTemplate},
		{Method: "GET", Path: "/templates", h: s.listTemplates},
		{Method: "GET", Path: "/templates/{templateID}", h: s.getTemplate},
		{Method: "DELETE", Path: "/templates/{templateID}", h: s.deleteTemplate},
		{Method: "POST", Path: "/sandboxes/{sandboxID}/commands", h: s.runCommand, Stream: true},
		{Method: "GET", Path: "/sandboxes/{sandboxID}/commands", h: s.listCommands},
		{Method: "POST", Path: "/sandboxes/{sandboxID}/commands/{pid}/stdin", h: s.commandStdin},
		{Method: "POST", Path: "/sandboxes/{sandboxID}/commands/{pid}/kill", h: s.killCommand},
		{Method: "GET", Path: "/sandboxes/{sandboxID}/files", h: s.readFile},
		{Method: "PUT", Path: "/sandboxes/{sandboxID}/files", h: s.writeFile, FileBody: true},
		{Method: "DELETE", Path: "/sandboxes/{sandboxID}/files", h: s.removeFile},
		{Method: "GET", Path: "/sandboxes/{sandboxID}/files/stat", h: s.statFile},
		{Method: "GET", Path: "/sandboxes/{sandboxID}/files/list", h: s.listDir},
		{Method: "POST", Path: "/sandboxes/{sandboxID}/files/dir", h: s.makeDir},
	}
}

// Stop ends the command output streams (their processes run on).
func (s *Server) Stop() { s.stopOnce.Do(func() { close(s.stop) }) }

func (s *Server) health(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

type ctxKey int

const logKey ctxKey = 0

// logOf is the request's logger (with its request id).
func logOf(r *http.Request) *logrus.Entry { return logOfCtx(r.Context()) }

// logOfCtx is the logger of the request whose context ctx is.
func logOfCtx(ctx context.Context) *logrus.Entry {
	if e, ok := ctx.Value(logKey).(*logrus.Entry); ok {
		return e
	}
	return logrus.NewEntry(logrus.StandardLogger())
}

// requestID is the client's X-Request-Id when it is short and plain, else a fresh one.
func requestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= 64 && !strings.ContainsFunc(id, func(c rune) bool {
		return c <= ' ' || c > '~'
	}) {
		return id
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// statusWriter records the status for logs and metrics.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// wrap adds to a route: request id, logging, metrics, auth, body and time limits.
func (s *Server) wrap(rt route) http.Handler {
	label := rt.Method + " " + rt.Path
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := requestID(r)
		w.Header().Set("X-Request-Id", id)
		entry := s.log.WithFields(logrus.Fields{"request_id": id, "route": label})
		ctx := context.WithValue(r.Context(), logKey, entry)
		if !rt.Stream {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, s.dur.Request)
			defer cancel()
		}
		r = r.WithContext(ctx)
		limit := s.cfg.MaxBodyBytes
		if rt.FileBody {
			limit = s.cfg.MaxFileBytes
		}
		r.Body = http.MaxBytesReader(w, r.Body, limit)
		sw := &statusWriter{ResponseWriter: w}
		// The body must arrive within BodyTimeout (a stream route clears the
		// deadline once it has read its body).
		_ = http.NewResponseController(sw).SetReadDeadline(start.Add(BodyTimeout))
		if err := s.authorize(r, rt); err != nil {
			s.writeError(sw, r, err)
		} else if err := rt.h(sw, r); err != nil {
			s.writeError(sw, r, err)
		}
		d := time.Since(start)
		s.metrics.observe(label, sw.code, d)
		entry.WithFields(logrus.Fields{"method": r.Method, "path": r.URL.Path, "status": sw.code, "ms": d.Milliseconds()}).Info("request")
	})
}

// authorize checks the API key when keys are configured.
func (s *Server) authorize(r *http.Request, rt route) error {
	if len(s.keys) == 0 || rt.Public {
		return nil
	}
	key := r.Header.Get("X-API-Key")
	if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && key == "" {
		key = strings.TrimSpace(b)
	}
	if key == "" {
		return fmt.Errorf("missing API key: send `Authorization: Bearer KEY` or `X-API-Key: KEY`: %w", errdefs.ErrUnauthenticated)
	}
	for _, k := range s.keys {
		if subtle.ConstantTimeCompare(k, []byte(key)) == 1 {
			return nil
		}
	}
	return fmt.Errorf("wrong API key: %w", errdefs.ErrUnauthenticated)
}
