package api

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"github.com/containerd/errdefs"
)

// E2B's in-sandbox daemon, envd, as cube-api serves it: E2B's SDKs send their
// commands and file operations to envd (Connect RPC services process.Process
// and filesystem.Filesystem, and the HTTP routes GET/POST /files), at the
// sandbox URL: E2B_SANDBOX_URL (every sandbox at one URL, the sandbox named
// by the header E2b-Sandbox-Id), or https://49983-<sandboxID>.<E2B_DOMAIN>
// (the sandbox named by the host). cube-api answers both itself, through
// the same backend as its own commands and files routes.

// EnvdVersion is the envd version cube-api reports (envdVersion): E2B's SDKs
// use the calls that version has (octet-stream uploads since 0.5.7, stdin
// close since 0.5.2, no default user "user" since 0.4.0).
const EnvdVersion = "0.5.7"

// EnvdPort is envd's port in E2B's sandbox host names (<port>-<sandboxID>.<domain>).
const EnvdPort = 49983

// Headers E2B's SDKs send to envd.
const (
	EnvdSandboxHeader = "E2b-Sandbox-Id"
	EnvdTokenHeader   = "X-Access-Token"
)

// withToken adds the sandbox's envd access token (when API keys are on).
func (s *Server) withToken(sb Sandbox) Sandbox {
	sb.EnvdAccessToken = s.envdToken(sb.SandboxID)
	return sb
}

// envdToken is sandbox id's envd access token: an HMAC of the id under a key
// derived from the API keys (so it needs no state, survives restarts of
// cube-api, and changes when the keys do); "" without API keys.
func (s *Server) envdToken(id string) string {
	if len(s.keys) == 0 {
		return ""
	}
	keys := make([]string, len(s.keys))
	for i, k := range s.keys {
		keys[i] = string(k)
	}
	sort.Strings(keys)
	secret := sha256.Sum256([]byte("cube-envd-token\x00" + strings.Join(keys, "\x00")))
	m := hmac.New(sha256.New, secret[:])
	m.Write([]byte(s.cfg.Namespace + "/" + id))
	return "cube_envd_" + hex.EncodeToString(m.Sum(nil)[:20])
}

// envdTarget is the sandbox of an envd request: from the host name
// 49983-<id>.<domain>, else the header E2b-Sandbox-Id.
func envdTarget(host, header string) (string, error) {
	if id, port, ok := proxyTarget(host); ok && port == EnvdPort {
		return id, nil
	}
	id := strings.TrimSpace(header)
	switch {
	case id == "":
		return "", invalid("header %q is required (E2B's SDK sends it; or name the sandbox in the host: %d-<sandboxID>.<domain>)", EnvdSandboxHeader, EnvdPort)
	case len(id) > 128 || !utf8.ValidString(id) || strings.ContainsAny(id, "/\x00 "):
		return "", invalid("header %q: %.64q is not a sandbox id", EnvdSandboxHeader, id)
	}
	return id, nil
}

// envdUser is the user of an envd request: E2B's SDK sends `Authorization:
// Basic base64(user:)` when a call names one. "" when none is named.
func envdUser(authorization string) (string, error) {
	b, ok := strings.CutPrefix(authorization, "Basic ")
	if !ok {
		return "", nil
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b))
	if err != nil {
		return "", invalid("header \"Authorization\": Basic credentials are not base64 (E2B's SDK sends base64(\"user:\"))")
	}
	user, _, _ := strings.Cut(string(raw), ":")
	if !utf8.ValidString(user) || strings.ContainsRune(user, 0) || len(user) > 64 {
		return "", invalid("header \"Authorization\": the user name is not UTF-8 of at most 64 bytes")
	}
	return user, nil
}

// envdCall is what the envd middleware learnt of a request: its sandbox and
// user, or why it is refused.
type envdCall struct {
	sandbox, user string
	err           error
}

type envdKey struct{}

// envdCallOf is the envd request's sandbox and user (its refusal as an error).
func envdCallOf(ctx context.Context) (envdCall, error) {
	c, ok := ctx.Value(envdKey{}).(envdCall)
	if !ok {
		return envdCall{}, fmt.Errorf("envd request without its sandbox: %w", errdefs.ErrInternal)
	}
	return c, c.err
}

// envdAuthorize resolves an envd request's sandbox and checks its
// credentials: an API key, or the sandbox's envd access token.
func (s *Server) envdAuthorize(r *http.Request) envdCall {
	id, err := envdTarget(r.Host, r.Header.Get(EnvdSandboxHeader))
	if err != nil {
		return envdCall{err: err}
	}
	user, err := envdUser(r.Header.Get("Authorization"))
	if err != nil {
		return envdCall{err: err}
	}
	if len(s.keys) == 0 {
		return envdCall{sandbox: id, user: user}
	}
	if tok := r.Header.Get(EnvdTokenHeader); tok != "" {
		if subtle.ConstantTimeCompare([]byte(tok), []byte(s.envdToken(id))) == 1 {
			return envdCall{sandbox: id, user: user}
		}
		return envdCall{err: fmt.Errorf("header %q: not the access token of sandbox %s (the envdAccessToken of its create or connect answer): %w", EnvdTokenHeader, id, errdefs.ErrUnauthenticated)}
	}
	if err := s.authorize(r, route{}); err != nil {
		return envdCall{err: fmt.Errorf("%v, or %s: the sandbox's envdAccessToken: %w", err, EnvdTokenHeader, errdefs.ErrUnauthenticated)}
	}
	return envdCall{sandbox: id, user: user}
}

// envdHandler serves E2B's envd protocol: the Connect services and the
// HTTP file routes, each request's sandbox and credentials resolved first.
func (s *Server) envdHandler() http.Handler {
	mux := http.NewServeMux()
	opts := []connect.HandlerOption{connect.WithInterceptors(envdErrors{})}
	path, h := s.processService(opts...)
	mux.Handle(path, h)
	path, h = s.filesystemService(opts...)
	mux.Handle(path, h)
	httpRoutes := map[string]func(http.ResponseWriter, *http.Request) error{
		"GET /files":  s.envdReadFile,
		"POST /files": s.envdWriteFile,
	}
	for pattern, fn := range httpRoutes {
		mux.Handle(pattern, s.wrap(route{Method: "*", Path: "envd " + pattern, Public: true, FileBody: true,
			h: func(w http.ResponseWriter, r *http.Request) error {
				call, err := envdCallOf(r.Context())
				if err != nil {
					return err
				}
				r.SetPathValue("sandboxID", call.sandbox)
				return fn(w, r)
			}}))
	}
	mux.Handle("GET /health", s.wrap(route{Method: "GET", Path: "envd /health", Public: true, h: func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(http.StatusNoContent)
		return nil
	}}))
	rpc := s.wrap(route{Method: "POST", Path: "envd rpc", Public: true, Stream: true, h: func(w http.ResponseWriter, r *http.Request) error {
		// The body is one message: once it is read, no read deadline (a
		// stream may last; the client's leaving is seen by the server's read).
		r.Body = &clearDeadlineAtEOF{ReadCloser: r.Body, rc: http.NewResponseController(w)}
		mux.ServeHTTP(w, r)
		return nil
	}})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = r.WithContext(context.WithValue(r.Context(), envdKey{}, s.envdAuthorize(r)))
		if strings.HasPrefix(r.URL.Path, "/process.Process/") || strings.HasPrefix(r.URL.Path, "/filesystem.Filesystem/") {
			rpc.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// isEnvdPath: a path of envd's protocol (not one of cube-api's own routes).
func isEnvdPath(p string) bool {
	return p == "/files" || strings.HasPrefix(p, "/process.Process/") || strings.HasPrefix(p, "/filesystem.Filesystem/")
}

// clearDeadlineAtEOF clears the connection's read deadline once the body is read.
type clearDeadlineAtEOF struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool
}

func (c *clearDeadlineAtEOF) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	if err == io.EOF && !c.done {
		c.done = true
		_ = c.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// envdErrors turns the handlers' errdefs classes into Connect codes, once.
type envdErrors struct{}

func (envdErrors) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		res, err := next(ctx, req)
		return res, connectError(err)
	}
}

func (envdErrors) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (envdErrors) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return connectError(next(ctx, conn))
	}
}

// connectError maps an errdefs class to its Connect code (nil stays nil).
func connectError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	code := connect.CodeInternal
	switch {
	case errdefs.IsInvalidArgument(err):
		code = connect.CodeInvalidArgument
	case errdefs.IsUnauthorized(err):
		code = connect.CodeUnauthenticated
	case errdefs.IsPermissionDenied(err):
		code = connect.CodePermissionDenied
	case errdefs.IsNotFound(err):
		code = connect.CodeNotFound
	case errdefs.IsAlreadyExists(err):
		code = connect.CodeAlreadyExists
	case errdefs.IsConflict(err), errdefs.IsFailedPrecondition(err):
		code = connect.CodeFailedPrecondition
	case errdefs.IsNotImplemented(err):
		code = connect.CodeUnimplemented
	case errdefs.IsUnavailable(err):
		code = connect.CodeUnavailable
	case errdefs.IsDeadlineExceeded(err), errors.Is(err, context.DeadlineExceeded):
		code = connect.CodeDeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	}
	return connect.NewError(code, err)
}
