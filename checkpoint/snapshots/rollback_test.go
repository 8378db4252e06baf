package snapshots

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	api "github.com/cube-runtime/cube/shim/snapshotapi"
)

// rollbackShim is the shim's service as Rollback sees it: the VMM is this
// process (a live pid for the store's references).
type rollbackShim struct {
	dirs []string
	fail error
}

func (f *rollbackShim) List(ctx context.Context, r *api.ListRequest) (*api.ListResponse, error) {
	return &api.ListResponse{SandboxId: "c1", VmmPid: uint32(os.Getpid())}, nil
}

func (f *rollbackShim) Rollback(ctx context.Context, r *api.RollbackRequest) (*api.RollbackResponse, error) {
	if f.fail != nil {
		return nil, f.fail
	}
	f.dirs = append(f.dirs, r.Dir)
	return &api.RollbackResponse{SandboxId: "c1", Dir: r.Dir, Id: r.Id, Memory: "rewrite-all"}, nil
}

func (h *harness) holders(t *testing.T, ref string) []string {
	t.Helper()
	s, err := h.st.Get(h.ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range s.Holders {
		if !r.Stale {
			out = append(out, r.Holder)
		}
	}
	return out
}

func TestRollbackHoldsTheSnapshot(t *testing.T) {
	h := newHarness(t)
	s1 := h.take(t, "s1", false).Snapshot
	s2 := h.take(t, "s2", false).Snapshot
	sh := &rollbackShim{}
	o := RollbackOptions{Container: "c1", Sandbox: SandboxKey("ns1", "c1")}

	o.Ref = "s1"
	rb, err := Rollback(h.ctx, h.st, sh, o)
	if err != nil {
		t.Fatal(err)
	}
	if rb.Snapshot.ID != s1.ID || len(sh.dirs) != 1 || sh.dirs[0] != s1.Dir || len(rb.Released) != 0 {
		t.Fatalf("rollback to s1: %+v, shim got %v", rb, sh.dirs)
	}
	if got := h.holders(t, "s1"); len(got) != 1 || got[0] != "sandbox ns1/c1" {
		t.Fatalf("s1 holders %v", got)
	}
	// Deleting it is refused while the VM maps it, naming the holder.
	if err := h.st.Delete(h.ctx, "s1"); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "sandbox ns1/c1") {
		t.Fatalf("delete of a held snapshot: %v", err)
	}

	// Rolling back to another one moves the reference.
	o.Ref = s2.ID
	if rb, err = Rollback(h.ctx, h.st, sh, o); err != nil {
		t.Fatal(err)
	}
	if len(rb.Released) != 1 || rb.Released[0] != s1.ID || len(h.holders(t, "s1")) != 0 || len(h.holders(t, "s2")) != 1 {
		t.Fatalf("released %v; s1 held by %v, s2 by %v", rb.Released, h.holders(t, "s1"), h.holders(t, "s2"))
	}

	// A rollback that fails keeps the references as they were.
	sh.fail = errors.New("rollback of c1: sandbox c1 is busy")
	o.Ref = "s1"
	if _, err := Rollback(h.ctx, h.st, sh, o); err == nil || !strings.Contains(err.Error(), "busy") {
		t.Fatalf("failed rollback: %v", err)
	}
	if len(h.holders(t, "s1")) != 0 || len(h.holders(t, "s2")) != 1 {
		t.Fatalf("after a failed rollback: s1 held by %v, s2 by %v", h.holders(t, "s1"), h.holders(t, "s2"))
	}
	// Refused as busy (Unavailable): another rollback may be running to
	// this very snapshot, under the same reference: it stays.
	sh.fail = fmt.Errorf("rollback of c1: sandbox c1 is busy: %w", errdefs.ErrUnavailable)
	if _, err := Rollback(h.ctx, h.st, sh, o); !errdefs.IsUnavailable(err) {
		t.Fatalf("busy rollback: %v", err)
	}
	if len(h.holders(t, "s1")) != 1 {
		t.Fatalf("after a busy refusal: s1 held by %v, want the reference kept", h.holders(t, "s1"))
	}
	// The next rollback drops it.
	sh.fail = nil
	o.Ref = "s2"
	if rb, err = Rollback(h.ctx, h.st, sh, o); err != nil || len(rb.Released) != 1 || rb.Released[0] != s1.ID {
		t.Fatalf("rollback after the busy one: %+v %v", rb, err)
	}
	// Again to the one it holds: still held once.
	sh.fail = nil
	o.Ref = "s2"
	if rb, err = Rollback(h.ctx, h.st, sh, o); err != nil || len(rb.Released) != 0 || len(h.holders(t, "s2")) != 1 {
		t.Fatalf("rollback to the held snapshot: %+v %v, holders %v", rb, err, h.holders(t, "s2"))
	}

	o.Ref = "nope"
	if _, err := Rollback(h.ctx, h.st, sh, o); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "cube snapshots ls") {
		t.Fatalf("unknown snapshot: %v", err)
	}
}
