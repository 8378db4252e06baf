package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"
)

// blockingInvoker stands for a guest that never answers: it returns only when its ctx ends.
func blockingInvoker(ctx context.Context, _ *ttrpc.Request, _ *ttrpc.Response) error {
	<-ctx.Done()
	return ctx.Err()
}

func TestAgentCallDeadline(t *testing.T) {
	bound := callDeadline(50 * time.Millisecond)
	start := time.Now()
	err := bound(context.Background(), &ttrpc.Request{}, &ttrpc.Response{}, &ttrpc.UnaryClientInfo{FullMethod: "/cube.agent.v1.Agent/MountDisk"}, blockingInvoker)
	if err == nil || !strings.Contains(err.Error(), "MountDisk got no answer within 50ms") || !strings.Contains(err.Error(), "agent_timeout") {
		t.Fatalf("a call the guest never answers: %v, want one naming the call, the bound and the config key", err)
	}
	if !errors.Is(err, errdefs.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v is not classed unavailable / deadline exceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("returned after %s, not at the bound", d)
	}

	// Wait is not bounded: the process may run for days.
	err = bound(context.Background(), &ttrpc.Request{}, &ttrpc.Response{}, &ttrpc.UnaryClientInfo{FullMethod: waitMethod},
		func(ctx context.Context, _ *ttrpc.Request, _ *ttrpc.Response) error {
			if _, ok := ctx.Deadline(); ok {
				return errors.New("Wait got a deadline")
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}

	// The caller's own cancellation is passed on as it is, not blamed on the guest.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = bound(ctx, &ttrpc.Request{}, &ttrpc.Response{}, &ttrpc.UnaryClientInfo{FullMethod: "/cube.agent.v1.Agent/Start"}, blockingInvoker)
	if !errors.Is(err, context.Canceled) || strings.Contains(err.Error(), "no answer") {
		t.Fatalf("caller cancelled: %v", err)
	}
}
