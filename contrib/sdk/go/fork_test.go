package cube

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/checkpoint/api"
	"github.com/cube-runtime/cube/checkpoint/snapshots"
	"github.com/cube-runtime/cube/checkpoint/store"
)

// Restore implements api.Restorer: the sandbox is made (the in-memory
// containerd has no VM to restore).
func (b *backend) Restore(ctx context.Context, s api.CreateSpec, sn store.Snapshot) (api.Container, error) {
	if err := b.makeFails(); err != nil {
		return api.Container{}, err
	}
	return b.Create(ctx, s)
}

// makeFails counts a sandbox made from a snapshot; the failAt'th fails.
func (b *backend) makeFails() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.made++
	if b.made == b.failAt {
		return fmt.Errorf("no memory for sandbox %d: %w", b.made, errdefs.ErrResourceExhausted)
	}
	return nil
}

// Fork implements api.Forker as checkpoint/clone does: a temporary
// snapshot (an operation of the store), the sandboxes, all-or-nothing, the
// snapshot dropped.
func (b *backend) Fork(ctx context.Context, id string, specs []api.CreateSpec, all bool) ([]api.ForkResult, error) {
	op := fmt.Sprintf("fork-%d", time.Now().UnixNano())
	if _, err := snapshots.Take(ctx, b.st, shim{}, snapshots.Options{Container: id, Sandbox: snapshots.SandboxKey(api.DefaultNamespace, id), Op: op}); err != nil {
		return nil, err
	}
	defer b.st.DropOp(context.WithoutCancel(ctx), op)
	out := make([]api.ForkResult, len(specs))
	failed := false
	for i, s := range specs {
		if failed && all {
			out[i].Err = fmt.Errorf("not made: %w", errdefs.ErrConflict)
			continue
		}
		if err := b.makeFails(); err != nil {
			out[i].Err, failed = err, true
			continue
		}
		out[i].Container, _ = b.Create(ctx, s)
	}
	if failed && all {
		for i := range out {
			if out[i].Err == nil {
				b.Delete(ctx, specs[i].ID)
				out[i] = api.ForkResult{Err: fmt.Errorf("deleted: %w", errdefs.ErrConflict)}
			}
		}
	}
	return out, nil
}

func TestCreateFromSnapshotAndTemplate(t *testing.T) {
	c, _ := newClient(t)
	ctx := context.Background()
	src, err := c.Create(ctx, CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := src.CreateSnapshot(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{snap.SnapshotID, "s1"} {
		sb, err := c.Create(ctx, CreateOptions{Template: ref})
		if err != nil || sb.Info.TemplateID != ref || sb.ID == src.ID {
			t.Errorf("from %s: %+v %v", ref, sb, err)
		}
	}
	if _, err := c.Create(ctx, CreateOptions{Template: "0123456789abcdef01234567"}); !IsNotFound(err) {
		t.Errorf("unknown snapshot: %v", err)
	}

	tp, err := c.BuildTemplate(ctx, "busybox", BuildTemplateOptions{TemplateID: "base", ReadyCmd: []string{"ready"}})
	if err != nil || tp.TemplateID != "base" || len(tp.SnapshotID) != 24 {
		t.Fatalf("build: %+v %v", tp, err)
	}
	if _, err := c.BuildTemplate(ctx, "nope", BuildTemplateOptions{}); !IsNotFound(err) {
		t.Errorf("build from an unknown image: %v", err)
	}
	if _, err := c.BuildTemplate(ctx, "busybox", BuildTemplateOptions{TemplateID: "base"}); !IsConflict(err) {
		t.Errorf("build a taken id: %v", err)
	}
	l, err := c.ListTemplates(ctx)
	if err != nil || len(l) != 1 || l[0].TemplateID != "base" {
		t.Errorf("list: %+v %v", l, err)
	}
	sb, err := c.Create(ctx, CreateOptions{Template: "base"})
	if err != nil || sb.Info.TemplateID != "base" {
		t.Errorf("from the template: %+v %v", sb, err)
	}
	if got, err := c.GetTemplate(ctx, "base"); err != nil || got.SnapshotID != tp.SnapshotID {
		t.Errorf("get: %+v %v", got, err)
	}
	if err := c.DeleteTemplate(ctx, "base"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetTemplate(ctx, "base"); !IsNotFound(err) {
		t.Errorf("get a deleted template: %v", err)
	}
	// As E2B's SDKs do (their snapshots are templates), DELETE /templates/{id} deletes a plain snapshot too.
	if err := c.DeleteTemplate(ctx, "nosuch"); !IsNotFound(err) {
		t.Errorf("delete an unknown template: %v", err)
	}
}

func TestForkAndClone(t *testing.T) {
	c, b := newClient(t)
	ctx := context.Background()
	src, err := c.Create(ctx, CreateOptions{Metadata: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	items, err := src.Fork(ctx, 3, ForkOptions{Timeout: 60})
	if err != nil || len(items) != 3 {
		t.Fatalf("fork: %+v %v", items, err)
	}
	for i, it := range items {
		if it.Err != nil || it.Sandbox == nil || it.Sandbox.Info.Metadata["k"] != "v" || it.Sandbox.Info.Timeout != 60 {
			t.Errorf("item %d: %+v", i, it)
		}
	}
	// Per-item failure.
	b.mu.Lock()
	b.made, b.failAt = 0, 2
	b.mu.Unlock()
	items, err = src.Fork(ctx, 3, ForkOptions{})
	if err != nil || items[0].Sandbox == nil || items[1].Err == nil || items[1].Err.Status != 500 || items[2].Sandbox == nil {
		t.Errorf("partial fork: %+v %v", items, err)
	}
	if _, err := src.Fork(ctx, 0, ForkOptions{}); statusOf(err) != 400 {
		t.Errorf("count 0: %v", err)
	}

	before := len(mustList(t, c))
	cl, err := src.Clone(ctx, 2, 2, 0)
	if err != nil || len(cl) != 2 || cl[0].ID == cl[1].ID {
		t.Fatalf("clone: %+v %v", cl, err)
	}
	if n := len(mustList(t, c)); n != before+2 {
		t.Errorf("%d sandboxes after clone(2), want %d", n, before+2)
	}
	// All or nothing: a failure kills the clones made; no snapshot is left.
	b.mu.Lock()
	b.made, b.failAt = 0, 3
	b.mu.Unlock()
	before = len(mustList(t, c))
	_, err = src.Clone(ctx, 4, 2, 0)
	var ce *CloneError
	if !errors.As(err, &ce) || len(ce.Errs) == 0 {
		t.Fatalf("clone with a failure: %v", err)
	}
	if n := len(mustList(t, c)); n != before {
		t.Errorf("%d sandboxes after a failed clone, want %d", n, before)
	}
	if l, _, err := c.ListSnapshots(ctx, ListSnapshotsOptions{}); err != nil || len(l) != 0 {
		t.Errorf("snapshots left: %+v %v", l, err)
	}
	if _, err := src.Clone(ctx, 2, 3, 0); err == nil {
		t.Error("clone with concurrency > n: no error")
	}
}

func mustList(t *testing.T, c *Client) []SandboxInfo {
	t.Helper()
	l, _, err := c.List(context.Background(), ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}
