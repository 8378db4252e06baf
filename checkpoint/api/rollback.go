package api

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
)

// RollbackRequest is POST /sandboxes/{id}/rollback's body (CubeSandbox's).
type RollbackRequest struct {
	SnapshotID string `json:"snapshotID"`
}

// RollbackInfo is a rollback's result: the same sandbox, now at the snapshot.
type RollbackInfo struct {
	SandboxID  string `json:"sandboxID"`
	SnapshotID string `json:"snapshotID"`
	// Memory is how the VMM brought guest memory back ("rewrite-dirty" or "remap").
	Memory string `json:"memory"`
	// FrozenMs: the vCPUs were stopped; TotalMs: the whole rollback.
	FrozenMs  float64             `json:"frozenMs"`
	TotalMs   float64             `json:"totalMs"`
	Processes []RolledBackProcess `json:"processes"`
	Warnings  []string            `json:"warnings"`
}

// RolledBackProcess is what the rollback did with one process of the
// sandbox: "ended" (started after the snapshot: it ended with 137),
// "revived" or "unknown" (it ran at the snapshot and runs again),
// "reattached" (it ran before and after), "unchanged".
type RolledBackProcess struct {
	Pid    uint32 `json:"pid"`
	Action string `json:"action"`
	Status string `json:"status"`
	// Command: the process is a command (GET …/commands lists it while it runs).
	Command bool `json:"command"`
}

// maxSnapshotRef bounds a snapshot id or name in a request.
const maxSnapshotRef = 256

// rollback is POST /sandboxes/{sandboxID}/rollback {snapshotID} → 200: the
// sandbox's VM rolled back in place; 404 for an unknown sandbox or
// snapshot, 409 while another snapshot or rollback runs on the sandbox.
func (s *Server) rollback(w http.ResponseWriter, r *http.Request) error {
	var req RollbackRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	switch {
	case req.SnapshotID == "":
		return invalid("field \"snapshotID\" is required")
	case len(req.SnapshotID) > maxSnapshotRef:
		return invalid("field \"snapshotID\": %d bytes, at most %d", len(req.SnapshotID), maxSnapshotRef)
	}
	id := r.PathValue("sandboxID")
	if _, err := s.be.Get(r.Context(), id); err != nil {
		return err
	}
	if _, err := s.st.Get(r.Context(), req.SnapshotID); err != nil {
		return fieldSnapshotError(req.SnapshotID, err)
	}
	unlock, err := s.busy.lock(id, "rollback")
	if err != nil {
		return err
	}
	defer unlock()
	start := time.Now()
	rb, err := s.be.Rollback(r.Context(), id, req.SnapshotID)
	s.metrics.rollback(err, time.Since(start))
	if err != nil {
		return err
	}
	out := RollbackInfo{SandboxID: id, SnapshotID: rb.Snapshot.ID, Memory: rb.VM.GetMemory(),
		FrozenMs: rb.VM.GetTimings().GetVmmFrozenMs(), TotalMs: rb.VM.GetTimings().GetShimTotalMs(),
		Processes: []RolledBackProcess{}, Warnings: append(append([]string{}, rb.VM.GetWarnings()...), rb.Warnings...)}
	for _, p := range rb.VM.GetProcesses() {
		if p.GetContainerId() != id {
			continue
		}
		out.Processes = append(out.Processes, RolledBackProcess{Pid: p.GetPid(), Action: p.GetAction(), Status: p.GetStatus(),
			Command: strings.HasPrefix(p.GetExecId(), ExecIDPrefix)})
	}
	// The commands that came back are listed (and can be signalled) at once.
	if err := s.syncCommands(context.WithoutCancel(r.Context()), id); err != nil {
		out.Warnings = append(out.Warnings, fmt.Sprintf("the commands that came back are not listed yet: %v", err))
	}
	logOf(r).WithFields(map[string]any{"sandbox": id, "snapshot": out.SnapshotID, "memory": out.Memory,
		"total_ms": out.TotalMs}).Info("sandbox rolled back")
	writeJSON(w, http.StatusOK, out)
	return nil
}

// fieldSnapshotError names the field of an unknown snapshot (404).
func fieldSnapshotError(ref string, err error) error {
	err = snapshotError(ref, err)
	if errdefs.IsNotFound(err) {
		return fmt.Errorf("field \"snapshotID\": %w", err)
	}
	return err
}

// busySandboxes refuses a second snapshot or rollback of a sandbox while one
// runs in this cube-api at once (409), as the shim refuses one from
// anywhere: the store's references of a rollback are taken and released
// around the shim's call, which must not interleave for one sandbox.
type busySandboxes struct {
	mu sync.Mutex
	m  map[string]string // sandbox → what runs
}

func newBusySandboxes() *busySandboxes { return &busySandboxes{m: map[string]string{}} }

// lock marks sandbox id busy with what, or refuses (Conflict) when it is.
func (b *busySandboxes) lock(id, what string) (unlock func(), err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if cur, ok := b.m[id]; ok {
		return nil, fmt.Errorf("sandbox %s is busy: a %s runs on it (one snapshot or rollback at a time; retry when it is done): %w", id, cur, errdefs.ErrConflict)
	}
	b.m[id] = what
	return func() {
		b.mu.Lock()
		delete(b.m, id)
		b.mu.Unlock()
	}, nil
}

// ForkRequest is POST /sandboxes/{id}/fork's body (CubeSandbox's).
type ForkRequest struct {
	Count   int `json:"count"`
	Timeout int `json:"timeout"`
	// AllOrNothing: on any failure the sandboxes made are deleted.
	AllOrNothing bool `json:"allOrNothing"`
}

// ForkItem is one sandbox of a fork: the sandbox, or why it failed.
type ForkItem struct {
	Sandbox *Sandbox `json:"sandbox,omitempty"`
	Error   *Error   `json:"error,omitempty"`
}

// MaxForkCount bounds a fork's count (CubeSandbox's).
const MaxForkCount = 100

// fork is POST /sandboxes/{sandboxID}/fork {count, timeout, allOrNothing}
// → 200 with one item per sandbox; 501 until the Backend is a Forker.
func (s *Server) fork(w http.ResponseWriter, r *http.Request) error {
	var req ForkRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	if req.Count < 1 || req.Count > MaxForkCount {
		return invalid("field \"count\": %d is out of range 1..%d", req.Count, MaxForkCount)
	}
	timeout, err := s.timeoutOf("timeout", req.Timeout)
	if err != nil {
		return err
	}
	id := r.PathValue("sandboxID")
	src, err := s.be.Get(r.Context(), id)
	if err != nil {
		return err
	}
	fk, ok := s.be.(Forker)
	if !ok {
		return fmt.Errorf("fork is not implemented yet in cube-api: %w", errdefs.ErrNotImplemented)
	}
	specs := make([]CreateSpec, req.Count)
	for i := range specs {
		labels := s.deadline(timeout)
		for _, k := range []string{LabelSandbox, LabelTemplate, LabelMetadata, LabelAutoPause} {
			labels[k] = src.Labels[k]
		}
		labels[LabelStarted] = s.now().UTC().Format(time.RFC3339Nano)
		specs[i] = CreateSpec{ID: newSandboxID(), Labels: labels}
	}
	unlock, err := s.busy.lock(id, "fork")
	if err != nil {
		return err
	}
	defer unlock()
	res, err := fk.Fork(r.Context(), id, specs, req.AllOrNothing)
	if err != nil {
		return err
	}
	out := make([]ForkItem, 0, len(res))
	for _, it := range res {
		if it.Err != nil {
			out = append(out, ForkItem{Error: &Error{Code: statusOf(it.Err), Message: it.Err.Error()}})
			continue
		}
		sb := s.withToken(sandboxOf(it.Container))
		out = append(out, ForkItem{Sandbox: &sb})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
