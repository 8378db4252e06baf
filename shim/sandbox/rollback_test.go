package sandbox_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/shim/sandbox"
)

func TestRollback(t *testing.T) {
	sb, vmm, agent := startFake(t)
	ctx := context.Background()
	snap := filepath.Join(t.TempDir(), "s1")
	if _, err := sb.Snapshot(ctx, sandbox.SnapshotOptions{Dir: snap}); err != nil {
		t.Fatal(err)
	}
	var order []string
	st, err := sb.Rollback(ctx, sandbox.RollbackOptions{Dir: snap,
		Prepare: func() { order = append(order, "prepare") },
		Abort:   func() { order = append(order, "abort") },
		Reconcile: func(ctx context.Context, a sandbox.AgentClient) ([]sandbox.ProcessChange, error) {
			order = append(order, "reconcile")
			if a != sb.Agent() {
				t.Error("Reconcile got another agent than the sandbox's")
			}
			return []sandbox.ProcessChange{{ContainerID: "c1", Action: sandbox.ActionReattached}}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(order, ",") != "prepare,reconcile" {
		t.Fatalf("hooks ran %v", order)
	}
	if st.VMM.Memory != "rewrite-dirty" || st.VMM.Pages != 42 || st.Total <= 0 || len(st.Warnings) != 0 || len(st.Processes) != 1 {
		t.Fatalf("stats %+v", st)
	}
	if len(vmm.Rollbacks) != 1 || vmm.Rollbacks[0] != snap || sb.Base() != snap {
		t.Fatalf("rollbacks %v, base %q", vmm.Rollbacks, sb.Base())
	}
	// Ordering: the agent dialed again (Health), then thaw, then clock and
	// RNG (one Freshen).
	log := strings.Join(agent.CallLog(), ",")
	if !strings.HasSuffix(log, "Health,ThawFilesystems,Freshen") {
		t.Fatalf("agent calls %s", log)
	}
}

// A rollback the VMM fails changes nothing: no redial, no reconciliation,
// Abort gives back what Prepare held.
func TestRollbackVMMFailure(t *testing.T) {
	sb, vmm, agent := startFake(t)
	ctx := context.Background()
	vmm.RollbackErr = errors.New("rollback: snapshot of another kernel")
	calls := len(agent.CallLog())
	var order []string
	_, err := sb.Rollback(ctx, sandbox.RollbackOptions{Dir: "/snaps/x",
		Prepare: func() { order = append(order, "prepare") },
		Abort:   func() { order = append(order, "abort") },
		Reconcile: func(context.Context, sandbox.AgentClient) ([]sandbox.ProcessChange, error) {
			order = append(order, "reconcile")
			return nil, nil
		}})
	if err == nil || !strings.Contains(err.Error(), "the VM goes on as it was") || !strings.Contains(err.Error(), "another kernel") {
		t.Fatalf("err %v", err)
	}
	if strings.Join(order, ",") != "prepare,abort" {
		t.Fatalf("hooks ran %v", order)
	}
	if n := len(agent.CallLog()); n != calls {
		t.Fatalf("the agent was called after a failed rollback: %v", agent.CallLog()[calls:])
	}
	if sb.State() != sandbox.StateRunning || sb.Busy() != "" {
		t.Fatalf("state %s, busy %q", sb.State(), sb.Busy())
	}
	// A refusal of cube-vmm's (no such snapshot here) is FailedPrecondition.
	vmm.RollbackErr = nil
	if _, err := sb.Rollback(ctx, sandbox.RollbackOptions{Dir: "/snaps/none"}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("refused rollback: %v", err)
	}
	if _, err := sb.Rollback(ctx, sandbox.RollbackOptions{Dir: "snaps/rel"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("relative dir: %v", err)
	}
}

// One whole-VM operation at a time: a rollback while another runs is
// refused at once, and so is a snapshot.
func TestRollbackBusy(t *testing.T) {
	sb, vmm, _ := startFake(t)
	ctx := context.Background()
	snap := filepath.Join(t.TempDir(), "s1")
	if _, err := sb.Snapshot(ctx, sandbox.SnapshotOptions{Dir: snap}); err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	vmm.RollbackFunc = func(ctx context.Context, dir string) error {
		close(entered)
		<-release
		return nil
	}
	done := make(chan error, 1)
	go func() {
		_, err := sb.Rollback(ctx, sandbox.RollbackOptions{Dir: snap, What: "rollback to s1"})
		done <- err
	}()
	<-entered
	start := time.Now()
	_, err := sb.Rollback(ctx, sandbox.RollbackOptions{Dir: snap})
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "busy: rollback to s1 has been running since") {
		t.Fatalf("second rollback: %v", err)
	}
	if _, err := sb.Snapshot(ctx, sandbox.SnapshotOptions{Dir: filepath.Join(t.TempDir(), "s2")}); !errdefs.IsUnavailable(err) {
		t.Fatalf("snapshot during a rollback: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the refusals took %v", d)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestRollbackPausedRefused(t *testing.T) {
	sb, _, _ := startFake(t)
	ctx := context.Background()
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Rollback(ctx, sandbox.RollbackOptions{Dir: "/snaps/a"}); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "resume") {
		t.Fatalf("rollback of a paused VM: %v", err)
	}
}
