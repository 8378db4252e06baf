package cube

import (
	"context"
	"fmt"
	"net/url"
	"strings"
)

// Sandbox is a handle on one sandbox.
type Sandbox struct {
	ID       string
	Info     SandboxInfo
	Commands *Commands
	Files    *Files
	c        *Client
}

func (c *Client) handle(info SandboxInfo) *Sandbox {
	s := &Sandbox{ID: info.SandboxID, Info: info, c: c}
	s.Commands = &Commands{s: s}
	s.Files = &Files{s: s}
	return s
}

// CreateOptions say what sandbox to create.
type CreateOptions struct {
	// Template is an image reference, a template id (BuildTemplate) or a
	// snapshot id or name (the sandbox is restored from it: its processes
	// run on from the snapshot); the client's Template when empty.
	Template string
	// Timeout in seconds (0: the server's default); past it the sandbox is
	// killed, or paused with AutoPause.
	Timeout   int
	Metadata  map[string]string
	Envs      map[string]string
	AutoPause bool
	// AllowInternetAccess false drops what Network.AllowOut does not name
	// (nil: allowed).
	AllowInternetAccess *bool
	// Network is the egress lists and the public-traffic switch.
	Network *Network
}

// Create creates a sandbox.
func (c *Client) Create(ctx context.Context, o CreateOptions) (*Sandbox, error) {
	tmpl := o.Template
	if tmpl == "" {
		tmpl = c.Template
	}
	body := map[string]any{"templateID": tmpl, "timeout": o.Timeout, "autoPause": o.AutoPause}
	if o.Metadata != nil {
		body["metadata"] = o.Metadata
	}
	if o.Envs != nil {
		body["envVars"] = o.Envs
	}
	o.networkBody(body)
	var info SandboxInfo
	if _, err := c.call(ctx, "POST", "/sandboxes", nil, body, &info); err != nil {
		return nil, err
	}
	return c.handle(info), nil
}

// Connect returns a handle on sandbox id, resuming it when paused; its
// timeout restarts (timeout seconds, 0: its own).
func (c *Client) Connect(ctx context.Context, id string, timeout int) (*Sandbox, error) {
	var body any
	if timeout > 0 {
		body = map[string]int{"timeout": timeout}
	}
	var info SandboxInfo
	if _, err := c.call(ctx, "POST", "/sandboxes/"+url.PathEscape(id)+"/connect", nil, body, &info); err != nil {
		return nil, err
	}
	return c.handle(info), nil
}

// ListOptions select a page of sandboxes.
type ListOptions struct {
	Metadata  map[string]string // all pairs must match
	State     []string          // running, paused, …
	Limit     int
	NextToken string
}

// List returns a page of sandboxes and the next page's token ("" after the last).
func (c *Client) List(ctx context.Context, o ListOptions) ([]SandboxInfo, string, error) {
	q := url.Values{}
	if len(o.Metadata) > 0 {
		md := url.Values{}
		for k, v := range o.Metadata {
			md.Set(k, v)
		}
		q.Set("metadata", md.Encode())
	}
	if len(o.State) > 0 {
		q.Set("state", strings.Join(o.State, ","))
	}
	if o.Limit > 0 {
		q.Set("limit", fmt.Sprint(o.Limit))
	}
	if o.NextToken != "" {
		q.Set("nextToken", o.NextToken)
	}
	var out []SandboxInfo
	h, err := c.call(ctx, "GET", "/v2/sandboxes", q, nil, &out)
	if err != nil {
		return nil, "", err
	}
	return out, h.Get("X-Next-Token"), nil
}

func (s *Sandbox) path(p string) string { return "/sandboxes/" + url.PathEscape(s.ID) + p }

// Refresh reads the sandbox's state again into Info.
func (s *Sandbox) Refresh(ctx context.Context) (SandboxInfo, error) {
	_, err := s.c.call(ctx, "GET", s.path(""), nil, nil, &s.Info)
	return s.Info, err
}

// Kill kills the sandbox (its snapshots stay).
func (s *Sandbox) Kill(ctx context.Context) error {
	_, err := s.c.call(ctx, "DELETE", s.path(""), nil, nil, nil)
	return err
}

// Pause pauses the sandbox (IsConflict when it is not running).
func (s *Sandbox) Pause(ctx context.Context) error {
	_, err := s.c.call(ctx, "POST", s.path("/pause"), nil, nil, nil)
	return err
}

// Resume resumes a paused sandbox; its timeout restarts (seconds; 0: its own).
func (s *Sandbox) Resume(ctx context.Context, timeout int) error {
	var body any
	if timeout > 0 {
		body = map[string]int{"timeout": timeout}
	}
	_, err := s.c.call(ctx, "POST", s.path("/resume"), nil, body, &s.Info)
	return err
}

// SetTimeout sets the sandbox's deadline to now + seconds.
func (s *Sandbox) SetTimeout(ctx context.Context, seconds int) error {
	_, err := s.c.call(ctx, "POST", s.path("/timeout"), nil, map[string]int{"timeout": seconds}, nil)
	return err
}

// CreateSnapshot snapshots the sandbox's VM (name optional; IsConflict
// while another snapshot of it runs or when the name is taken).
func (s *Sandbox) CreateSnapshot(ctx context.Context, name string) (*Snapshot, error) {
	var body any
	if name != "" {
		body = map[string]string{"name": name}
	}
	var out Snapshot
	if _, err := s.c.call(ctx, "POST", s.path("/snapshots"), nil, body, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListSnapshots lists this sandbox's snapshots (one page).
func (s *Sandbox) ListSnapshots(ctx context.Context, limit int, nextToken string) ([]Snapshot, string, error) {
	return s.c.ListSnapshots(ctx, ListSnapshotsOptions{SandboxID: s.ID, Limit: limit, NextToken: nextToken})
}

// Rollback is a rollback's result (the sandbox keeps its id).
type Rollback struct {
	SandboxID  string  `json:"sandboxID"`
	SnapshotID string  `json:"snapshotID"`
	Memory     string  `json:"memory"`
	FrozenMs   float64 `json:"frozenMs"`
	TotalMs    float64 `json:"totalMs"`
	Processes  []struct {
		Pid     uint32 `json:"pid"`
		Action  string `json:"action"`
		Status  string `json:"status"`
		Command bool   `json:"command"`
	} `json:"processes"`
	Warnings []string `json:"warnings"`
}

// Rollback rolls the sandbox's VM back in place to snapshot ref (an id or a
// name): its processes, memory and disk as they were at the snapshot.
// IsNotFound for an unknown snapshot, IsConflict while another snapshot or
// rollback of the sandbox runs. The client's idle pooled connections are
// closed afterwards (a kept-alive connection may be stale after a restore).
func (s *Sandbox) Rollback(ctx context.Context, ref string) (*Rollback, error) {
	var out Rollback
	if _, err := s.c.call(ctx, "POST", s.path("/rollback"), nil, map[string]string{"snapshotID": ref}, &out); err != nil {
		return nil, err
	}
	s.c.http().CloseIdleConnections()
	return &out, nil
}
