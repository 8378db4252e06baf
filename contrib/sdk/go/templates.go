package cube

import (
	"context"
	"net/url"
	"time"
)

// Template is a template of cube-api: a snapshot of a sandbox booted from
// an image and ready, that sandboxes are created from (CreateOptions.Template).
type Template struct {
	TemplateID string    `json:"templateID"`
	SnapshotID string    `json:"snapshotID"`
	Image      string    `json:"image"`
	SizeBytes  int64     `json:"sizeBytes"`
	CreatedAt  time.Time `json:"createdAt"`
	InUse      bool      `json:"inUse"`
	BuildMs    float64   `json:"buildMs,omitempty"`
}

// BuildTemplateOptions say how to build a template.
type BuildTemplateOptions struct {
	// TemplateID names it (generated when empty).
	TemplateID string
	// StartCmd is the sandbox's main process (default: the server's
	// sandbox_command, else the image's).
	StartCmd []string
	// ReadyCmd is run until it exits 0 (default: "true").
	ReadyCmd []string
	// ReadyTimeout in seconds (0: the server's default, 60).
	ReadyTimeout int
	Envs         map[string]string
}

// BuildTemplate builds a template from image: the server boots a sandbox,
// waits until ReadyCmd exits 0, snapshots it and deletes the build sandbox.
func (c *Client) BuildTemplate(ctx context.Context, image string, o BuildTemplateOptions) (*Template, error) {
	body := map[string]any{"image": image, "templateID": o.TemplateID, "readyTimeout": o.ReadyTimeout}
	if len(o.StartCmd) > 0 {
		body["startCmd"] = o.StartCmd
	}
	if len(o.ReadyCmd) > 0 {
		body["readyCmd"] = o.ReadyCmd
	}
	if o.Envs != nil {
		body["envVars"] = o.Envs
	}
	var out Template
	if _, err := c.call(ctx, "POST", "/templates", nil, body, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListTemplates lists the templates, oldest first.
func (c *Client) ListTemplates(ctx context.Context) ([]Template, error) {
	var out []Template
	_, err := c.call(ctx, "GET", "/templates", nil, nil, &out)
	return out, err
}

// GetTemplate returns template id (IsNotFound when there is none).
func (c *Client) GetTemplate(ctx context.Context, id string) (*Template, error) {
	var out Template
	if _, err := c.call(ctx, "GET", "/templates/"+url.PathEscape(id), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteTemplate deletes template id (IsConflict while a sandbox made from it
// runs). As in E2B's SDKs, a snapshot's id or name is taken too.
func (c *Client) DeleteTemplate(ctx context.Context, id string) error {
	_, err := c.call(ctx, "DELETE", "/templates/"+url.PathEscape(id), nil, nil, nil)
	return err
}
