package api

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

// Labels of a sandbox's container: its API state lives there.
const (
	LabelSandbox   = "cube.api/sandbox" // "1": a sandbox of cube-api
	LabelTemplate  = "cube.api/template"
	LabelMetadata  = "cube.api/metadata" // JSON object
	LabelStarted   = "cube.api/started"  // RFC 3339
	LabelEnd       = "cube.api/end"      // RFC 3339: the deadline
	LabelTimeout   = "cube.api/timeout"  // seconds
	LabelAutoPause = "cube.api/auto-pause"
	LabelPublic    = "cube.api/public-traffic" // "false": its ports need an API key
)

// maxMetadataBytes keeps the metadata label within containerd's label size limit.
const maxMetadataBytes = 3800

// Sandbox is a sandbox as the API shows it (E2B's field names).
type Sandbox struct {
	SandboxID  string            `json:"sandboxID"`
	TemplateID string            `json:"templateID"`
	ClientID   string            `json:"clientID"`
	State      string            `json:"state"`
	StartedAt  time.Time         `json:"startedAt"`
	EndAt      time.Time         `json:"endAt"`
	Timeout    int               `json:"timeout"`
	AutoPause  bool              `json:"autoPause"`
	Metadata   map[string]string `json:"metadata"`
	// EnvdVersion is the version of E2B's in-sandbox daemon (envd) whose
	// protocol cube-api serves for the sandbox (E2B's SDKs pick their calls by it).
	EnvdVersion string `json:"envdVersion"`
	// EnvdAccessToken is the sandbox's token for the envd routes (E2B's
	// X-Access-Token), in the answers of create, connect, resume and fork;
	// absent when cube-api has no API keys.
	EnvdAccessToken string `json:"envdAccessToken,omitempty"`
}

// CreateSandboxRequest is POST /sandboxes's body.
type CreateSandboxRequest struct {
	TemplateID string            `json:"templateID"`
	Timeout    int               `json:"timeout"`
	Metadata   map[string]string `json:"metadata"`
	EnvVars    map[string]string `json:"envVars"`
	AutoPause  bool              `json:"autoPause"`
	// AllowInternetAccess false drops what network.allowOut does not name
	// (CubeSandbox's and E2B's allow_internet_access; default true).
	AllowInternetAccess *bool `json:"allow_internet_access,omitempty"`
	// Network is E2B's egress lists and public-traffic switch.
	Network *NetworkRequest `json:"network,omitempty"`
}

// TimeoutRequest is the body of …/timeout, …/connect and …/resume.
type TimeoutRequest struct {
	Timeout int `json:"timeout"`
	// Memory false (E2B's connect with onResume "reboot") is not
	// implemented: a sandbox keeps its memory.
	Memory *bool `json:"memory,omitempty"`
}

// PauseRequest is …/pause's optional body.
type PauseRequest struct {
	// Memory false (E2B's pause({keepMemory: false}): a filesystem-only
	// pause) is not implemented: the whole VM is paused.
	Memory *bool `json:"memory,omitempty"`
}

// memoryKept refuses memory false (501), naming the field.
func memoryKept(m *bool) error {
	if m != nil && !*m {
		return fmt.Errorf("field \"memory\": false (drop the memory, keep the files) is not implemented: a sandbox's whole VM is paused and resumed: %w", errdefs.ErrNotImplemented)
	}
	return nil
}

// RefreshRequest is the body of …/refreshes.
type RefreshRequest struct {
	Duration int `json:"duration"`
}

// stateOf maps a task status to the API's state.
func stateOf(status string) string {
	switch status {
	case "running":
		return "running"
	case "paused", "pausing":
		return "paused"
	case "":
		return "stopped"
	}
	return status
}

// sandboxOf reads a sandbox from its container's labels.
func sandboxOf(c Container) Sandbox {
	sb := Sandbox{SandboxID: c.ID, TemplateID: c.Labels[LabelTemplate], ClientID: "cube", State: stateOf(c.Status),
		AutoPause: c.Labels[LabelAutoPause] == "true", Metadata: map[string]string{}, EnvdVersion: EnvdVersion}
	sb.StartedAt, _ = time.Parse(time.RFC3339Nano, c.Labels[LabelStarted])
	if sb.StartedAt.IsZero() {
		sb.StartedAt = c.Created
	}
	sb.EndAt, _ = time.Parse(time.RFC3339Nano, c.Labels[LabelEnd])
	sb.Timeout, _ = strconv.Atoi(c.Labels[LabelTimeout])
	_ = json.Unmarshal([]byte(c.Labels[LabelMetadata]), &sb.Metadata)
	return sb
}

// newSandboxID is 20 lowercase letters and digits.
func newSandboxID() string {
	const abc = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = abc[int(b[i])%len(abc)]
	}
	return string(b)
}

// timeoutOf checks a timeout field (0: the default).
func (s *Server) timeoutOf(field string, t int) (int, error) {
	switch {
	case t == 0:
		return s.cfg.DefaultSandboxTimeout, nil
	case t < 0 || t > s.cfg.MaxSandboxTimeout:
		return 0, invalid("field %q: %d seconds is out of range 1..%d (max_sandbox_timeout)", field, t, s.cfg.MaxSandboxTimeout)
	}
	return t, nil
}

// deadline is the labels of a timeout counted from now.
func (s *Server) deadline(timeout int) map[string]string {
	return map[string]string{LabelTimeout: strconv.Itoa(timeout),
		LabelEnd: s.now().Add(time.Duration(timeout) * time.Second).UTC().Format(time.RFC3339Nano)}
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) error {
	var req CreateSandboxRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	if req.TemplateID == "" {
		req.TemplateID = s.cfg.DefaultTemplate
	}
	if req.TemplateID == "" {
		return invalid("field \"templateID\" is required (no default_template is configured)")
	}
	timeout, err := s.timeoutOf("timeout", req.Timeout)
	if err != nil {
		return err
	}
	md := req.Metadata
	if md == nil {
		md = map[string]string{}
	}
	mdJSON, _ := json.Marshal(md)
	if len(mdJSON) > maxMetadataBytes {
		return invalid("field \"metadata\": %d bytes as JSON, more than %d", len(mdJSON), maxMetadataBytes)
	}
	var env []string
	for k, v := range req.EnvVars {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return invalid("field \"envVars\": name %q is empty or holds '=' or NUL", k)
		}
		env = append(env, k+"="+v)
	}
	labels := s.deadline(timeout)
	labels[LabelSandbox] = "1"
	labels[LabelTemplate] = req.TemplateID
	labels[LabelMetadata] = string(mdJSON)
	labels[LabelStarted] = s.now().UTC().Format(time.RFC3339Nano)
	labels[LabelAutoPause] = strconv.FormatBool(req.AutoPause)
	spec := CreateSpec{ID: newSandboxID(), Env: env, Labels: labels, Command: s.cfg.SandboxCommand}
	if err := s.networkOf(&req, &spec); err != nil {
		return err
	}
	var c Container
	if sn, err := s.st.Get(r.Context(), req.TemplateID); err == nil {
		rs, ok := s.be.(Restorer)
		if !ok {
			return fmt.Errorf("templateID %q is a snapshot: creating a sandbox from a snapshot is not implemented yet: %w", req.TemplateID, errdefs.ErrNotImplemented)
		}
		if c, err = rs.Restore(r.Context(), spec, sn); err != nil {
			return err
		}
	} else {
		if err := s.be.CheckImage(r.Context(), req.TemplateID); err != nil {
			if errdefs.IsNotFound(err) {
				return fmt.Errorf("field \"templateID\": unknown template %q: no such image or snapshot (%v): %w", req.TemplateID, err, errdefs.ErrNotFound)
			}
			return err
		}
		spec.Image = req.TemplateID
		if c, err = s.be.Create(r.Context(), spec); err != nil {
			return err
		}
	}
	logOf(r).WithField("sandbox", c.ID).Info("sandbox created")
	writeJSON(w, http.StatusCreated, s.withToken(sandboxOf(c)))
	return nil
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) error {
	c, err := s.be.Get(r.Context(), r.PathValue("sandboxID"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sandboxOf(c))
	return nil
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("sandboxID")
	if err := s.be.Delete(r.Context(), id); err != nil {
		return err
	}
	s.cmds.forget(id)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) error {
	var req PauseRequest
	if err := decode(r, &req, true); err != nil {
		return err
	}
	if err := memoryKept(req.Memory); err != nil {
		return err
	}
	id := r.PathValue("sandboxID")
	c, err := s.be.Get(r.Context(), id)
	if err != nil {
		return err
	}
	if st := stateOf(c.Status); st != "running" {
		return fmt.Errorf("sandbox %s is %s: only a running sandbox can be paused: %w", id, st, errdefs.ErrConflict)
	}
	if err := s.be.Pause(r.Context(), id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// resume resumes a paused sandbox and restarts its timeout.
func (s *Server) resume(r *http.Request, id string, timeout int) (Sandbox, error) {
	if err := s.be.Resume(r.Context(), id); err != nil {
		return Sandbox{}, err
	}
	if err := s.be.SetLabels(r.Context(), id, s.deadline(timeout)); err != nil {
		return Sandbox{}, err
	}
	c, err := s.be.Get(r.Context(), id)
	return s.withToken(sandboxOf(c)), err
}

// timeoutBody reads an optional {timeout} body; 0 keeps the sandbox's own.
func (s *Server) timeoutBody(r *http.Request, c Container) (int, error) {
	var req TimeoutRequest
	if err := decode(r, &req, true); err != nil {
		return 0, err
	}
	if err := memoryKept(req.Memory); err != nil {
		return 0, err
	}
	if req.Timeout == 0 {
		if t, err := strconv.Atoi(c.Labels[LabelTimeout]); err == nil && t > 0 {
			return t, nil
		}
	}
	return s.timeoutOf("timeout", req.Timeout)
}

func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("sandboxID")
	c, err := s.be.Get(r.Context(), id)
	if err != nil {
		return err
	}
	timeout, err := s.timeoutBody(r, c)
	if err != nil {
		return err
	}
	if st := stateOf(c.Status); st != "paused" {
		return fmt.Errorf("sandbox %s is %s, not paused: %w", id, st, errdefs.ErrConflict)
	}
	sb, err := s.resume(r, id, timeout)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, sb)
	return nil
}

// connectSandbox resumes a paused sandbox (201) or returns a running one
// (200); both restart its timeout.
func (s *Server) connectSandbox(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("sandboxID")
	c, err := s.be.Get(r.Context(), id)
	if err != nil {
		return err
	}
	timeout, err := s.timeoutBody(r, c)
	if err != nil {
		return err
	}
	switch stateOf(c.Status) {
	case "paused":
		sb, err := s.resume(r, id, timeout)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusCreated, sb)
		return nil
	case "running":
		if err := s.be.SetLabels(r.Context(), id, s.deadline(timeout)); err != nil {
			return err
		}
		if c, err = s.be.Get(r.Context(), id); err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, s.withToken(sandboxOf(c)))
		return nil
	}
	return fmt.Errorf("sandbox %s is %s: it can be neither resumed nor connected to: %w", id, stateOf(c.Status), errdefs.ErrConflict)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) error {
	var req TimeoutRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	if req.Timeout <= 0 {
		return invalid("field \"timeout\": want seconds from now, 1..%d", s.cfg.MaxSandboxTimeout)
	}
	t, err := s.timeoutOf("timeout", req.Timeout)
	if err != nil {
		return err
	}
	return s.extend(w, r, t, false)
}

// refresh extends the deadline to now + duration when that is later.
func (s *Server) refresh(w http.ResponseWriter, r *http.Request) error {
	var req RefreshRequest
	if err := decode(r, &req, true); err != nil {
		return err
	}
	t, err := s.timeoutOf("duration", req.Duration)
	if err != nil {
		return err
	}
	return s.extend(w, r, t, true)
}

// extend sets the deadline to now + t (only when later, with onlyLater).
func (s *Server) extend(w http.ResponseWriter, r *http.Request, t int, onlyLater bool) error {
	id := r.PathValue("sandboxID")
	c, err := s.be.Get(r.Context(), id)
	if err != nil {
		return err
	}
	labels := s.deadline(t)
	if onlyLater {
		end, _ := time.Parse(time.RFC3339Nano, labels[LabelEnd])
		if sandboxOf(c).EndAt.After(end) {
			w.WriteHeader(http.StatusNoContent)
			return nil
		}
	}
	if err := s.be.SetLabels(r.Context(), id, labels); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
