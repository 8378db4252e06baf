package cli

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/cube-runtime/cube/shim/sandbox"
)

// RollbackSandbox makes oneVM a snapshotsvc.Processes without processes:
// the sandbox's own rollback, nothing to reconcile.
func (o oneVM) RollbackSandbox(ctx context.Context, containerID, dir, what string) (sandbox.RollbackStats, error) {
	return o.sb.Rollback(ctx, sandbox.RollbackOptions{Dir: dir, What: what})
}

func (o oneVM) GuestProcesses(ctx context.Context, containerID string) ([]sandbox.GuestProcess, error) {
	return o.sb.Agent().ListProcesses(ctx)
}

func (o oneVM) SignalGuest(ctx context.Context, containerID, execID string, sig uint32, all bool) error {
	return o.sb.Agent().Signal(ctx, containerID, execID, sig, all)
}

func TestRollbackCommand(t *testing.T) {
	w := newWorld(t)
	w.vmm.PID = os.Getpid() // a live pid: the store's reference follows it
	w.cube(t, ExitOK, "snapshot", "c1", "--name", "s1")
	w.cube(t, ExitOK, "snapshot", "c1", "--name", "s2")
	out, _ := w.cube(t, ExitOK, "rollback", "c1", "s1")
	for _, want := range []string{"sandbox:  ns1/c1 (vmm pid", "memory:   rewrite-all", "frozen:   2.0 ms"} {
		if !strings.Contains(out, want) {
			t.Errorf("cube rollback output lacks %q:\n%s", want, out)
		}
	}
	// The sandbox holds s1 now: rm is refused, naming it.
	_, errOut := w.cube(t, ExitFailure, "snapshots", "rm", "s1")
	if !strings.Contains(errOut, `"sandbox ns1/c1"`) {
		t.Errorf("rm of a held snapshot: %s", errOut)
	}
	// Rolling back to s2 releases s1.
	out, _ = w.cube(t, ExitOK, "rollback", "c1", "s2", "--json")
	if !strings.Contains(out, `"memory": "rewrite-all"`) {
		t.Errorf("--json: %s", out)
	}
	w.cube(t, ExitOK, "snapshots", "rm", "s1")

	_, errOut = w.cube(t, ExitFailure, "rollback", "c1", "nope")
	if !strings.Contains(errOut, "no snapshot \"nope\"") || !strings.Contains(errOut, "cube snapshots ls") {
		t.Errorf("unknown snapshot: %s", errOut)
	}
	_, errOut = w.cube(t, ExitFailure, "rollback", "runc", "s2")
	if !strings.Contains(errOut, "io.cube.v1") {
		t.Errorf("runc container: %s", errOut)
	}
	_, errOut = w.cube(t, ExitUsage, "rollback", "c1")
	if !strings.Contains(errOut, "want CONTAINER and SNAPSHOT") {
		t.Errorf("usage: %s", errOut)
	}
	out, _ = w.cube(t, ExitOK, "rollback", "--help")
	if !strings.Contains(out, "Usage: cube rollback CONTAINER SNAPSHOT") || !strings.Contains(out, "137") {
		t.Errorf("help: %s", out)
	}
}
