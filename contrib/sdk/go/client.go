// Package cube is the Go SDK of cube-api (docs/api.md): sandboxes,
// snapshots and commands, with names that mirror the CubeSandbox / E2B SDKs.
//
//	import cube "github.com/cube-runtime/cube/contrib/sdk/go"
//
//	c := cube.NewClient()                       // CUBE_API_URL, CUBE_API_KEY
//	sb, err := c.Create(ctx, cube.CreateOptions{Template: "docker.io/library/busybox:latest"})
//	defer sb.Kill(ctx)
//	res, err := sb.Commands.Run(ctx, "echo hello", cube.RunOptions{})
//	snap, err := sb.CreateSnapshot(ctx, "after-hello")
package cube

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Environment variables the client reads (as CubeSandbox's SDK does).
const (
	EnvAPIURL     = "CUBE_API_URL"
	EnvAPIKey     = "CUBE_API_KEY"
	EnvTemplateID = "CUBE_TEMPLATE_ID"
)

// DefaultURL is cube-api's default address.
const DefaultURL = "http://127.0.0.1:3000"

// Client talks to one cube-api.
type Client struct {
	// URL is cube-api's base URL (CUBE_API_URL, else DefaultURL).
	URL string
	// APIKey is sent as `Authorization: Bearer` when set (CUBE_API_KEY).
	APIKey string
	// Template is Create's default template (CUBE_TEMPLATE_ID).
	Template string
	// HTTP is the HTTP client (http.DefaultClient when nil; command streams
	// need one without a total timeout).
	HTTP *http.Client
}

// NewClient is a client set up from the environment.
func NewClient() *Client {
	u := os.Getenv(EnvAPIURL)
	if u == "" {
		u = DefaultURL
	}
	return &Client{URL: strings.TrimRight(u, "/"), APIKey: os.Getenv(EnvAPIKey), Template: os.Getenv(EnvTemplateID)}
}

// APIError is an error response of cube-api.
type APIError struct {
	Status    int    // HTTP status
	Code      int    `json:"code"`
	Message   string `json:"message"`
	RequestID string // X-Request-Id
}

func (e *APIError) Error() string {
	return fmt.Sprintf("cube-api: %d: %s (request %s)", e.Status, e.Message, e.RequestID)
}

// IsNotFound and IsConflict classify an error of the client.
func IsNotFound(err error) bool { return statusOf(err) == http.StatusNotFound }

// IsConflict: the state refuses the operation (busy, in use, already paused, a taken name).
func IsConflict(err error) bool { return statusOf(err) == http.StatusConflict }

func statusOf(err error) int {
	if e, ok := err.(*APIError); ok {
		return e.Status
	}
	return 0
}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// send sends a request with body (JSON when not nil) and returns the
// response; an error status is an *APIError (the body closed).
func (c *Client) send(ctx context.Context, method, path string, q url.Values, body any) (*http.Response, error) {
	var r io.Reader
	ctype := ""
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		r, ctype = bytes.NewReader(b), "application/json"
	}
	return c.sendRaw(ctx, method, path, q, ctype, r)
}

// sendRaw sends a request with body r of content type ctype (none when "").
func (c *Client) sendRaw(ctx context.Context, method, path string, q url.Values, ctype string, r io.Reader) (*http.Response, error) {
	u := c.URL + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, r)
	if err != nil {
		return nil, err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if c.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.APIKey)
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		e := &APIError{Status: resp.StatusCode, RequestID: resp.Header.Get("X-Request-Id")}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(b, e) != nil || e.Message == "" {
			e.Message = strings.TrimSpace(string(b))
		}
		return nil, e
	}
	return resp, nil
}

// call sends a request and decodes the JSON answer into out (when not nil).
func (c *Client) call(ctx context.Context, method, path string, q url.Values, body, out any) (http.Header, error) {
	resp, err := c.send(ctx, method, path, q, body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return nil, fmt.Errorf("cube-api: %s %s: decode the answer: %w", method, path, err)
		}
	}
	return resp.Header, nil
}

// SandboxInfo is a sandbox as cube-api shows it.
type SandboxInfo struct {
	SandboxID  string            `json:"sandboxID"`
	TemplateID string            `json:"templateID"`
	ClientID   string            `json:"clientID"`
	State      string            `json:"state"`
	StartedAt  time.Time         `json:"startedAt"`
	EndAt      time.Time         `json:"endAt"`
	Timeout    int               `json:"timeout"`
	AutoPause  bool              `json:"autoPause"`
	Metadata   map[string]string `json:"metadata"`
}

// Snapshot is a snapshot in the store.
type Snapshot struct {
	SnapshotID string    `json:"snapshotID"`
	Names      []string  `json:"names"`
	SandboxID  string    `json:"sandboxID"`
	Kind       string    `json:"kind"`
	Parent     string    `json:"parent,omitempty"`
	SizeBytes  int64     `json:"sizeBytes"`
	CreatedAt  time.Time `json:"createdAt"`
	InUse      bool      `json:"inUse"`
	FrozenMs   float64   `json:"frozenMs,omitempty"`
	TotalMs    float64   `json:"totalMs,omitempty"`
}

// ListSnapshotsOptions select a page of snapshots.
type ListSnapshotsOptions struct {
	SandboxID string
	Limit     int
	NextToken string
}

// ListSnapshots returns a page of snapshots and the next page's token ("" after the last).
func (c *Client) ListSnapshots(ctx context.Context, o ListSnapshotsOptions) ([]Snapshot, string, error) {
	q := url.Values{}
	if o.SandboxID != "" {
		q.Set("sandboxID", o.SandboxID)
	}
	if o.Limit > 0 {
		q.Set("limit", fmt.Sprint(o.Limit))
	}
	if o.NextToken != "" {
		q.Set("nextToken", o.NextToken)
	}
	var out []Snapshot
	h, err := c.call(ctx, "GET", "/snapshots", q, nil, &out)
	if err != nil {
		return nil, "", err
	}
	return out, h.Get("X-Next-Token"), nil
}

// GetSnapshot returns a snapshot by id or name.
func (c *Client) GetSnapshot(ctx context.Context, ref string) (*Snapshot, error) {
	var s Snapshot
	if _, err := c.call(ctx, "GET", "/snapshots/"+url.PathEscape(ref), nil, nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// DeleteSnapshot deletes a snapshot (IsConflict while it is in use).
func (c *Client) DeleteSnapshot(ctx context.Context, ref string) error {
	_, err := c.call(ctx, "DELETE", "/snapshots/"+url.PathEscape(ref), nil, nil, nil)
	return err
}

// Health checks that cube-api answers.
func (c *Client) Health(ctx context.Context) error {
	_, err := c.call(ctx, "GET", "/health", nil, nil, nil)
	return err
}
