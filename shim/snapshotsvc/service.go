// Package snapshotsvc is the shim's own snapshot service, cube.snapshot.v1
// (shim/snapshotapi), served on the shim's ttrpc socket beside the task API
// (snapshotsvc/plugin registers it). It snapshots the sandbox's whole VM
// into a directory the caller names, rolls it back in place (rollback.go),
// one snapshot or rollback at a time per sandbox, and
// remembers what its VM wrote for List and Inspect.
//
// The caller owns the snapshot store: it reserves the directory (store Begin),
// calls Snapshot, then commits or aborts. The shim neither opens the store
// nor knows where it is: checkpoint/ is the layer above the shim, and the
// shim imports nothing of it (docs/shim.md, "Snapshot service").
package snapshotsvc

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/ttrpc"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"

	"github.com/cube-runtime/cube/shim/sandbox"
	api "github.com/cube-runtime/cube/shim/snapshotapi"
)

// Sandboxes is what the service needs of the task service (*task.Service):
// the VM that runs a container of this shim.
type Sandboxes interface {
	SandboxOf(containerID string) (*sandbox.Sandbox, error)
}

// Options configure a Service.
type Options struct {
	// Namespace is containerd's namespace of this shim, reported in records.
	Namespace string
	Sandboxes Sandboxes
	Log       *logrus.Entry
}

// MaxRecords bounds the snapshots a shim remembers (the oldest are forgotten
// first; the store keeps every snapshot regardless).
const MaxRecords = 1024

// Service implements api.SnapshotsService.
type Service struct {
	o Options

	mu      sync.Mutex
	records []record // oldest first, of every VM this shim ran
}

// record is one snapshot a VM of this shim wrote.
type record struct {
	sb   *sandbox.Sandbox
	snap *api.Snapshot
}

var _ api.SnapshotsService = (*Service)(nil)

// New returns the service.
func New(o Options) *Service {
	if o.Log == nil {
		o.Log = logrus.NewEntry(logrus.StandardLogger())
	}
	return &Service{o: o}
}

// RegisterTTRPC implements containerd's shim.TTRPCService: pkg/shim calls it
// with the shim's one ttrpc server, the task API's.
func (s *Service) RegisterTTRPC(server *ttrpc.Server) error {
	api.RegisterSnapshotsService(server, s)
	return nil
}

// Snapshot implements api.SnapshotsService.
func (s *Service) Snapshot(ctx context.Context, req *api.SnapshotRequest) (*api.SnapshotResponse, error) {
	if err := checkSnapshotRequest(req); err != nil {
		return nil, errOut(err)
	}
	sb, err := s.o.Sandboxes.SandboxOf(req.ContainerId)
	if err != nil {
		return nil, errOut(fmt.Errorf("snapshot of %s: %w", req.ContainerId, err))
	}
	what := "snapshot " + label(req.Id, req.Names) + " (of container " + req.ContainerId + ") into " + req.Dir
	started := time.Now()
	st, err := sb.Snapshot(ctx, sandbox.SnapshotOptions{Dir: req.Dir, Incremental: req.Incremental, What: what})
	if err != nil {
		return nil, errOut(fmt.Errorf("snapshot of %s: %w", req.ContainerId, err))
	}
	// The CPU it was taken on, which a restore elsewhere checks (shim/task, restore.go).
	if err := sandbox.WriteHostFacts(req.Dir); err != nil {
		s.o.Log.WithError(err).Warn("snapshot: this host's CPU not recorded")
	}
	snap := &api.Snapshot{
		Id: req.Id, Names: req.Names, Namespace: s.o.Namespace, SandboxId: sb.ID(), ContainerId: req.ContainerId,
		Dir: req.Dir, Incremental: req.Incremental, StartedUnixNano: started.UnixNano(), VmmPid: uint32(sb.Pid()),
		Timings: &api.Timings{FrozenMs: st.VMM.FrozenMS, TotalMs: ms(st.Total), SyncMs: ms(st.Sync),
			PrecopyMs: st.VMM.PrecopyMS, VmmTotalMs: st.VMM.TotalMS},
		Sizes: &api.Sizes{MemoryBytes: st.VMM.MemoryBytes, RecopiedBytes: st.VMM.RecopiedBytes,
			DiskBytes: st.VMM.DiskBytes, Reflinked: st.VMM.Reflinked},
	}
	s.mu.Lock()
	s.records = append(s.records, record{sb: sb, snap: snap})
	if n := len(s.records) - MaxRecords; n > 0 {
		s.records = append([]record(nil), s.records[n:]...)
	}
	s.mu.Unlock()
	s.o.Log.WithFields(logrus.Fields{"sandbox": sb.ID(), "container": req.ContainerId, "id": req.Id, "dir": req.Dir,
		"incremental": req.Incremental, "frozen_ms": st.VMM.FrozenMS, "total_ms": ms(st.Total),
		"memory_bytes": st.VMM.MemoryBytes, "disk_bytes": st.VMM.DiskBytes}).Info("snapshot written")
	return &api.SnapshotResponse{Snapshot: withBase(snap, sb)}, nil
}

// List implements api.SnapshotsService.
func (s *Service) List(ctx context.Context, req *api.ListRequest) (*api.ListResponse, error) {
	sb, err := s.sandboxOf("list snapshots", req.ContainerId)
	if err != nil {
		return nil, errOut(err)
	}
	resp := &api.ListResponse{SandboxId: sb.ID(), Busy: sb.Busy(), VmmPid: uint32(sb.Pid())}
	for _, r := range s.recordsOf(sb) {
		resp.Snapshots = append(resp.Snapshots, withBase(r, sb))
	}
	return resp, nil
}

// Inspect implements api.SnapshotsService: the newest snapshot of the
// sandbox's VM whose id, name or directory is req.Ref.
func (s *Service) Inspect(ctx context.Context, req *api.InspectRequest) (*api.InspectResponse, error) {
	if req.Ref == "" || len(req.Ref) > maxPath {
		return nil, errOut(fmt.Errorf("inspect: ref %.64q: want a snapshot id, name or directory: %w", req.Ref, errdefs.ErrInvalidArgument))
	}
	sb, err := s.sandboxOf("inspect snapshot", req.ContainerId)
	if err != nil {
		return nil, errOut(err)
	}
	recs := s.recordsOf(sb)
	for i := len(recs) - 1; i >= 0; i-- {
		if matches(recs[i], req.Ref) {
			return &api.InspectResponse{Snapshot: withBase(recs[i], sb)}, nil
		}
	}
	return nil, errOut(fmt.Errorf("inspect: no snapshot %q among the %d the VM of sandbox %s wrote since it started (the snapshot store lists them all: cube snapshots ls): %w",
		req.Ref, len(recs), sb.ID(), errdefs.ErrNotFound))
}

func (s *Service) sandboxOf(op, containerID string) (*sandbox.Sandbox, error) {
	if containerID == "" {
		return nil, fmt.Errorf("%s: no container id: %w", op, errdefs.ErrInvalidArgument)
	}
	sb, err := s.o.Sandboxes.SandboxOf(containerID)
	if err != nil {
		return nil, fmt.Errorf("%s of %s: %w", op, containerID, err)
	}
	return sb, nil
}

// recordsOf returns the snapshots sb wrote, oldest first.
func (s *Service) recordsOf(sb *sandbox.Sandbox) []*api.Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*api.Snapshot
	for _, r := range s.records {
		if r.sb == sb {
			out = append(out, r.snap)
		}
	}
	return out
}

// checkSnapshotRequest refuses what the VMM or the record cannot take.
func checkSnapshotRequest(req *api.SnapshotRequest) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("snapshot of %.64q: %s: %w", req.ContainerId, fmt.Sprintf(format, a...), errdefs.ErrInvalidArgument)
	}
	switch {
	case req.ContainerId == "":
		return bad("no container id")
	case req.Dir == "" || !filepath.IsAbs(req.Dir) || filepath.Clean(req.Dir) != req.Dir || len(req.Dir) > maxPath:
		return bad("dir %q must be an absolute, clean path that does not exist yet (the caller's snapshot store reserves it)", req.Dir)
	case strings.ContainsAny(req.Dir, "\n\x00"):
		return bad("dir %q holds a newline or NUL", req.Dir)
	case len(req.Id) > api.MaxRefLength:
		return bad("id of %d bytes, at most %d", len(req.Id), api.MaxRefLength)
	case len(req.Names) > api.MaxNames:
		return bad("%d names, at most %d", len(req.Names), api.MaxNames)
	}
	for _, n := range req.Names {
		if n == "" || len(n) > api.MaxRefLength {
			return bad("name %.64q: 1 to %d bytes", n, api.MaxRefLength)
		}
	}
	return nil
}

// matches says whether ref names snapshot r: its id, a name or its dir.
func matches(r *api.Snapshot, ref string) bool {
	if ref == r.Id || ref == r.Dir {
		return true
	}
	for _, n := range r.Names {
		if n == ref {
			return true
		}
	}
	return false
}

// withBase is a copy of r saying whether it is sb's base now (a copy: a
// record may be marshalled for several replies at once).
func withBase(r *api.Snapshot, sb *sandbox.Sandbox) *api.Snapshot {
	c := proto.Clone(r).(*api.Snapshot)
	c.Base = r.Dir == sb.Base()
	return c
}

// label names a snapshot in messages: its first name, else its id.
func label(id string, names []string) string {
	switch {
	case len(names) > 0:
		return fmt.Sprintf("%q", names[0])
	case id != "":
		return id
	}
	return "(unnamed)"
}

// maxPath bounds a directory (PATH_MAX), and so a ref.
const maxPath = 4096

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func errOut(err error) error {
	if err == nil {
		return nil
	}
	return errgrpc.ToGRPC(err)
}
