package api

import (
	"context"
	"errors"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"
)

// statusCtr is a containerd container whose task's status blocks until its
// context ends (block), fails (err), or is status.
type statusCtr struct {
	containerd.Container // unused methods panic
	id                   string
	block                bool
	err                  error
	status               containerd.ProcessStatus
}

func (c *statusCtr) ID() string { return c.id }

func (c *statusCtr) Info(context.Context, ...containerd.InfoOpts) (containers.Container, error) {
	return containers.Container{ID: c.id, Labels: map[string]string{LabelSandbox: "1"}}, nil
}

func (c *statusCtr) Task(context.Context, cio.Attach) (containerd.Task, error) {
	if c.err != nil {
		return nil, c.err
	}
	return &statusTask{c: c}, nil
}

type statusTask struct {
	containerd.Task
	c *statusCtr
}

func (t *statusTask) Status(ctx context.Context) (containerd.Status, error) {
	if t.c.block {
		<-ctx.Done()
		return containerd.Status{}, ctx.Err()
	}
	return containerd.Status{Status: t.c.status}, nil
}

// A shim that does not answer in time makes its sandbox "unknown" in a list
// (not a failed list); a lone Get still waits and fails with the cause; a
// sandbox without a task has no status.
func TestDescribeWithinStatusTimeout(t *testing.T) {
	c := &Containerd{}
	ctx := context.Background()
	got, err := c.describeWithin(ctx, &statusCtr{id: "slow", block: true}, 20*time.Millisecond)
	if err != nil || got.Status != StatusUnknown || got.ID != "slow" {
		t.Fatalf("slow shim in a list: %+v, %v; want status %q and no error", got, err, StatusUnknown)
	}
	got, err = c.describeWithin(ctx, &statusCtr{id: "up", status: containerd.Running}, 20*time.Millisecond)
	if err != nil || got.Status != "running" {
		t.Fatalf("answering shim: %+v, %v", got, err)
	}
	got, err = c.describeWithin(ctx, &statusCtr{id: "gone", err: errdefs.ErrNotFound}, 20*time.Millisecond)
	if err != nil || got.Status != "" {
		t.Fatalf("no task: %+v, %v; want no status, no error", got, err)
	}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := c.describe(cctx, &statusCtr{id: "slow", block: true}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("describe of a slow shim: %v, want the deadline", err)
	}
	if sb := sandboxOf(Container{ID: "x", Status: StatusUnknown}); sb.State != StatusUnknown {
		t.Fatalf("state of an unknown status: %q", sb.State)
	}
}
