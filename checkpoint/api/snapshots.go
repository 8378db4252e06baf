package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/checkpoint/snapshots"
	"github.com/cube-runtime/cube/checkpoint/store"
)

// SnapshotInfo is a snapshot as the API shows it (snapshotID and names as E2B's).
type SnapshotInfo struct {
	SnapshotID string    `json:"snapshotID"`
	Names      []string  `json:"names"`
	SandboxID  string    `json:"sandboxID"`
	Kind       string    `json:"kind"`
	Parent     string    `json:"parent,omitempty"`
	SizeBytes  int64     `json:"sizeBytes"`
	CreatedAt  time.Time `json:"createdAt"`
	InUse      bool      `json:"inUse"`
	// FrozenMs and TotalMs: how long the VM was frozen and the snapshot took
	// (in the create response only).
	FrozenMs float64 `json:"frozenMs,omitempty"`
	TotalMs  float64 `json:"totalMs,omitempty"`
}

// CreateSnapshotRequest is POST /sandboxes/{id}/snapshots's body (optional).
type CreateSnapshotRequest struct {
	Name string `json:"name"`
}

// sandboxOfKey is the sandbox id of a store sandbox key in our namespace
// (the key as is for another namespace's).
func (s *Server) sandboxOfKey(key string) string {
	if id, ok := strings.CutPrefix(key, s.cfg.Namespace+"/"); ok {
		return id
	}
	return key
}

func (s *Server) snapshotInfo(sn store.Snapshot) SnapshotInfo {
	names := sn.Names
	if names == nil {
		names = []string{}
	}
	return SnapshotInfo{SnapshotID: sn.ID, Names: names, SandboxID: s.sandboxOfKey(sn.Sandbox), Kind: string(sn.Kind),
		Parent: sn.Parent, SizeBytes: sn.Size, CreatedAt: sn.Created, InUse: len(sn.Holders) > 0}
}

// createSnapshot is POST /sandboxes/{sandboxID}/snapshots → 201; 409 while
// another snapshot of the sandbox runs or when the name is taken.
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	var req CreateSnapshotRequest
	if err := decode(r, &req, true); err != nil {
		return err
	}
	id := r.PathValue("sandboxID")
	if _, err := s.be.Get(r.Context(), id); err != nil {
		return err
	}
	var names []string
	if req.Name != "" {
		names = []string{req.Name}
	}
	unlock, err := s.busy.lock(id, "snapshot")
	if err != nil {
		return err
	}
	defer unlock()
	start := time.Now()
	t, err := s.be.Snapshot(r.Context(), id, names)
	s.metrics.snapshot(err, time.Since(start))
	if err != nil {
		if errdefs.IsInvalidArgument(err) && req.Name != "" {
			return fmt.Errorf("field \"name\": %w", err)
		}
		return err
	}
	info := s.snapshotInfo(t.Snapshot)
	info.FrozenMs, info.TotalMs = t.VM.GetTimings().GetFrozenMs(), t.VM.GetTimings().GetTotalMs()
	logOf(r).WithFields(map[string]any{"sandbox": id, "snapshot": info.SnapshotID}).Info("snapshot taken")
	writeJSON(w, http.StatusCreated, info)
	return nil
}

// listSnapshots is GET /snapshots?sandboxID=&limit=&nextToken=: oldest
// first, the next token in X-Next-Token.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit, err := limitOf(q)
	if err != nil {
		return err
	}
	opts := store.ListOptions{Limit: limit, Token: q.Get("nextToken")}
	if sb := q.Get("sandboxID"); sb != "" {
		opts.Sandbox = snapshots.SandboxKey(s.cfg.Namespace, sb)
	}
	list, next, err := s.st.List(r.Context(), opts)
	if err != nil {
		if errdefs.IsInvalidArgument(err) {
			return fmt.Errorf("query parameter \"nextToken\": %w", err)
		}
		return err
	}
	out := make([]SnapshotInfo, 0, len(list))
	for _, sn := range list {
		out = append(out, s.snapshotInfo(sn))
	}
	if next != "" {
		w.Header().Set(NextTokenHeader, next)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) error {
	sn, err := s.st.Get(r.Context(), r.PathValue("snapshotID"))
	if err != nil {
		return snapshotError(r.PathValue("snapshotID"), err)
	}
	writeJSON(w, http.StatusOK, s.snapshotInfo(sn))
	return nil
}

// deleteSnapshot → 204; 409 while a VM maps it or another snapshot builds on it.
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) error {
	if err := s.st.Delete(r.Context(), r.PathValue("snapshotID")); err != nil {
		return snapshotError(r.PathValue("snapshotID"), err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// snapshotError: a ref that is neither an id nor a name can name no snapshot (404).
func snapshotError(ref string, err error) error {
	if errdefs.IsInvalidArgument(err) {
		return fmt.Errorf("no snapshot %q: %v: %w", ref, err, errdefs.ErrNotFound)
	}
	return err
}

// takeError marks the shim's "busy" (Unavailable, from its Snapshot call) a conflict.
func takeError(err error) error {
	if errdefs.IsUnavailable(err) && !errors.Is(err, errdefs.ErrConflict) {
		return conflictError{err}
	}
	return err
}
