package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/checkpoint/clone"
	"github.com/cube-runtime/cube/checkpoint/store"
)

// A template is a snapshot of the store with two names: its id, and
// TemplateMark+id, which marks it a template. Creating a sandbox with the
// template id restores it (the id is a store name); the store keeps it
// across restarts of cube-api.
const TemplateMark = "cube-template."

// LabelBuild is on a template's build sandbox: the template it builds.
const LabelBuild = "cube.api/build"

// Template defaults and bounds.
const (
	DefaultReadyTimeout = 60 // seconds
	readyPoll           = 200 * time.Millisecond
)

// BuildTemplateRequest is POST /templates's body.
type BuildTemplateRequest struct {
	// TemplateID names the template (a store name; generated when empty).
	TemplateID string `json:"templateID"`
	// Image is the image to boot (required).
	Image string `json:"image"`
	// StartCmd replaces the image's entrypoint and cmd (sandbox_command's
	// role) when set.
	StartCmd []string `json:"startCmd"`
	// ReadyCmd is run in the sandbox until it exits 0 (default ["true"]).
	ReadyCmd []string `json:"readyCmd"`
	// ReadyTimeout bounds waiting for ReadyCmd, seconds (default 60).
	ReadyTimeout int               `json:"readyTimeout"`
	EnvVars      map[string]string `json:"envVars"`
}

// TemplateInfo is a template as the API shows it.
type TemplateInfo struct {
	TemplateID string    `json:"templateID"`
	SnapshotID string    `json:"snapshotID"`
	Image      string    `json:"image"`
	SizeBytes  int64     `json:"sizeBytes"`
	CreatedAt  time.Time `json:"createdAt"`
	InUse      bool      `json:"inUse"`
	// BuildMs is how long the build took (in the build response only).
	BuildMs float64 `json:"buildMs,omitempty"`
}

// templateOf is the template a snapshot is, if it is one.
func templateOf(sn store.Snapshot) (TemplateInfo, bool) {
	for _, n := range sn.Names {
		if id, ok := strings.CutPrefix(n, TemplateMark); ok {
			info := TemplateInfo{TemplateID: id, SnapshotID: sn.ID, SizeBytes: sn.Size, CreatedAt: sn.Created, InUse: len(sn.Holders) > 0}
			if rec, err := clone.ReadRecord(sn.Dir); err == nil {
				info.Image = rec.Image
			}
			return info, true
		}
	}
	return TemplateInfo{}, false
}

// checkBuild checks a build request and fills its defaults.
func (s *Server) checkBuild(req *BuildTemplateRequest) (env []string, err error) {
	if req.Image == "" {
		return nil, invalid("field \"image\" is required")
	}
	if req.TemplateID == "" {
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		req.TemplateID = "tpl-" + hex.EncodeToString(b)
	}
	if len(req.TemplateID) > store.MaxNameLen-len(TemplateMark) || strings.HasPrefix(req.TemplateID, TemplateMark) {
		return nil, invalid("field \"templateID\": %q: at most %d bytes, not starting with %q", req.TemplateID, store.MaxNameLen-len(TemplateMark), TemplateMark)
	}
	if len(req.ReadyCmd) == 0 {
		req.ReadyCmd = []string{"true"}
	}
	switch {
	case req.ReadyTimeout == 0:
		req.ReadyTimeout = DefaultReadyTimeout
	case req.ReadyTimeout < 0 || req.ReadyTimeout > int(s.dur.Request/time.Second):
		return nil, invalid("field \"readyTimeout\": %d seconds is out of range 1..%d (request_timeout)", req.ReadyTimeout, int(s.dur.Request/time.Second))
	}
	for k, v := range req.EnvVars {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, invalid("field \"envVars\": name %q is empty or holds '=' or NUL", k)
		}
		env = append(env, k+"="+v)
	}
	return env, nil
}

// buildTemplate is POST /templates → 201: a sandbox of the image is
// created, ReadyCmd run in it until it exits 0, its VM snapshotted into the
// store under the template's names, and the build sandbox deleted. 404 for
// an unknown image, 409 when the id is taken, 504 when it is not ready in time.
func (s *Server) buildTemplate(w http.ResponseWriter, r *http.Request) error {
	var req BuildTemplateRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	env, err := s.checkBuild(&req)
	if err != nil {
		return err
	}
	ctx := r.Context()
	if _, err := s.st.Get(ctx, req.TemplateID); err == nil {
		return fmt.Errorf("field \"templateID\": %q names a snapshot or template already: %w", req.TemplateID, errdefs.ErrAlreadyExists)
	}
	if err := s.be.CheckImage(ctx, req.Image); err != nil {
		if errdefs.IsNotFound(err) {
			return fmt.Errorf("field \"image\": unknown image %q (%v): %w", req.Image, err, errdefs.ErrNotFound)
		}
		return err
	}
	start := time.Now()
	cmd := req.StartCmd
	if len(cmd) == 0 {
		cmd = s.cfg.SandboxCommand
	}
	// The build sandbox times out like any (the reaper ends it if this
	// cube-api dies during the build).
	labels := s.deadline(req.ReadyTimeout + int(s.dur.Request/time.Second))
	labels[LabelSandbox] = "1"
	labels[LabelTemplate] = req.Image
	labels[LabelBuild] = req.TemplateID
	labels[LabelStarted] = s.now().UTC().Format(time.RFC3339Nano)
	spec := CreateSpec{ID: newSandboxID(), Image: req.Image, Env: env, Labels: labels, Command: cmd}
	c, err := s.be.Create(ctx, spec)
	if err != nil {
		return fmt.Errorf("template %s: create the build sandbox: %w", req.TemplateID, err)
	}
	// Ordering: the build sandbox goes once its snapshot is committed (or
	// the build failed); the template does not need it.
	defer func() {
		if derr := s.be.Delete(context.WithoutCancel(ctx), c.ID); derr != nil {
			logOf(r).WithError(derr).WithField("sandbox", c.ID).Warn("template build: delete the build sandbox")
		}
	}()
	if err := s.waitReady(ctx, c.ID, req.ReadyCmd, time.Duration(req.ReadyTimeout)*time.Second); err != nil {
		return fmt.Errorf("template %s: %w", req.TemplateID, err)
	}
	t, err := s.be.Snapshot(ctx, c.ID, []string{req.TemplateID, TemplateMark + req.TemplateID})
	if err != nil {
		if errdefs.IsInvalidArgument(err) {
			return fmt.Errorf("field \"templateID\": %w", err)
		}
		return fmt.Errorf("template %s: snapshot: %w", req.TemplateID, err)
	}
	info, _ := templateOf(t.Snapshot)
	info.BuildMs = float64(time.Since(start).Microseconds()) / 1000
	logOf(r).WithFields(map[string]any{"template": req.TemplateID, "snapshot": t.Snapshot.ID, "build_ms": info.BuildMs}).Info("template built")
	writeJSON(w, http.StatusCreated, info)
	return nil
}

// waitReady runs cmd in sandbox id until it exits 0, for at most limit.
func (s *Server) waitReady(ctx context.Context, id string, cmd []string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	last := "it did not run yet"
	for {
		p, err := s.be.Exec(ctx, id, ExecSpec{Cmd: cmd[0], Args: cmd[1:]}, ExecIO{Stdout: io.Discard, Stderr: io.Discard})
		if err == nil {
			code, werr := p.Wait(ctx)
			switch {
			case werr != nil:
				last = werr.Error()
			case code == 0:
				return nil
			default:
				last = "exit code " + strconv.Itoa(code)
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready within %v: readyCmd %q: %s: %w", limit, cmd, last, context.DeadlineExceeded)
		case <-time.After(readyPoll):
		}
	}
}

// listTemplates is GET /templates: the store's templates, oldest first.
func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) error {
	list, _, err := s.st.List(r.Context(), store.ListOptions{})
	if err != nil {
		return err
	}
	out := []TemplateInfo{}
	for _, sn := range list {
		if t, ok := templateOf(sn); ok {
			out = append(out, t)
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// template returns template id's snapshot (404 when it is none).
func (s *Server) template(ctx context.Context, id string) (store.Snapshot, error) {
	sn, err := s.st.Get(ctx, TemplateMark+id)
	if errdefs.IsNotFound(err) || errdefs.IsInvalidArgument(err) {
		return store.Snapshot{}, fmt.Errorf("no template %q (GET /templates lists them): %w", id, errdefs.ErrNotFound)
	}
	return sn, err
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) error {
	sn, err := s.template(r.Context(), r.PathValue("templateID"))
	if err != nil {
		return err
	}
	t, _ := templateOf(sn)
	writeJSON(w, http.StatusOK, t)
	return nil
}

// deleteTemplate → 204; 409 while a sandbox made from it runs (it maps the
// snapshot). A snapshot's id or name is taken too: E2B's SDKs delete a
// snapshot with DELETE /templates/{id} (its snapshots are templates).
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) error {
	sn, err := s.template(r.Context(), r.PathValue("templateID"))
	if errdefs.IsNotFound(err) {
		if plain, perr := s.st.Get(r.Context(), r.PathValue("templateID")); perr == nil {
			sn, err = plain, nil
		}
	}
	if err != nil {
		return err
	}
	if err := s.st.Delete(r.Context(), sn.ID); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
