// Package filessvc is the shim's files service, cube.files.v1
// (shim/filesapi), served on the shim's ttrpc socket beside the task API
// (filessvc/plugin registers it): a sandbox's files for the layer above
// (cube-api), passed to the guest agent's file RPCs in the named
// container's root. It checks and bounds each request before the guest
// sees it; the agent resolves paths inside the container's root.
package filessvc

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/ttrpc"

	"github.com/cube-runtime/cube/guest-agent/protocol"
	api "github.com/cube-runtime/cube/shim/filesapi"
	"github.com/cube-runtime/cube/shim/sandbox"
)

// Sandboxes is what the service needs of the task service (*task.Service):
// the VM that runs a container of this shim.
type Sandboxes interface {
	SandboxOf(containerID string) (*sandbox.Sandbox, error)
}

// Service implements api.FilesService.
type Service struct {
	sbs   Sandboxes
	files func(*sandbox.Sandbox) (sandbox.FileService, error)
}

var _ api.FilesService = (*Service)(nil)

// New returns the service over the task service's sandboxes.
func New(sbs Sandboxes) *Service {
	return &Service{sbs: sbs, files: (*sandbox.Sandbox).Files}
}

// RegisterTTRPC implements containerd's shim.TTRPCService.
func (s *Service) RegisterTTRPC(server *ttrpc.Server) error {
	api.RegisterFilesService(server, s)
	return nil
}

// agent checks the container id and path and returns the agent's file RPCs
// of the container's VM.
func (s *Service) agent(op, containerID, path string) (sandbox.FileService, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%s of %.64q: %s: %w", op, containerID, fmt.Sprintf(format, a...), errdefs.ErrInvalidArgument)
	}
	switch {
	case containerID == "":
		return nil, bad("no container id")
	case path == "" || path[0] != '/':
		return nil, bad("path %.64q must be absolute", path)
	case len(path) > api.MaxPath:
		return nil, bad("path of %d bytes, at most %d", len(path), api.MaxPath)
	case strings.ContainsRune(path, 0) || !utf8.ValidString(path):
		return nil, bad("path %.64q holds NUL or is not UTF-8", path)
	}
	sb, err := s.sbs.SandboxOf(containerID)
	if err != nil {
		return nil, fmt.Errorf("%s of %s: %w", op, containerID, err)
	}
	return s.files(sb)
}

// errOut is err as the ttrpc status the client maps back (an agent's status passes as is).
func errOut(err error) error {
	if err == nil {
		return nil
	}
	return errgrpc.ToGRPC(err)
}

// ReadFile implements api.FilesService.
func (s *Service) ReadFile(ctx context.Context, req *api.ReadFileRequest) (*api.ReadFileResponse, error) {
	if req.Offset < 0 {
		return nil, errOut(fmt.Errorf("read %s: offset %d is negative: %w", req.Path, req.Offset, errdefs.ErrInvalidArgument))
	}
	a, err := s.agent("read", req.ContainerId, req.Path)
	if err != nil {
		return nil, errOut(err)
	}
	n := req.Length
	if n == 0 || n > api.MaxChunk {
		n = api.MaxChunk
	}
	r, err := a.ReadFile(ctx, &protocol.ReadFileRequest{ContainerId: req.ContainerId, Path: req.Path, Offset: req.Offset, Length: n})
	if err != nil {
		return nil, errOut(err)
	}
	return &api.ReadFileResponse{Data: r.Data, Eof: r.Eof, Size: r.Size}, nil
}

// WriteFile implements api.FilesService.
func (s *Service) WriteFile(ctx context.Context, req *api.WriteFileRequest) (*api.WriteFileResponse, error) {
	if len(req.Data) > api.MaxChunk {
		return nil, errOut(fmt.Errorf("write %s: %d bytes, at most %d per request (append the rest): %w", req.Path, len(req.Data), api.MaxChunk, errdefs.ErrInvalidArgument))
	}
	if req.Mode > 0o7777 {
		return nil, errOut(fmt.Errorf("write %s: mode %o out of range: %w", req.Path, req.Mode, errdefs.ErrInvalidArgument))
	}
	a, err := s.agent("write", req.ContainerId, req.Path)
	if err != nil {
		return nil, errOut(err)
	}
	r, err := a.WriteFile(ctx, &protocol.WriteFileRequest{ContainerId: req.ContainerId, Path: req.Path, Data: req.Data,
		Mode: req.Mode, Append: req.Append, MakeParents: true})
	if err != nil {
		return nil, errOut(err)
	}
	return &api.WriteFileResponse{Size: r.Size}, nil
}

func statOf(st *protocol.FileStat) *api.FileStat {
	if st == nil {
		return nil
	}
	return &api.FileStat{Name: st.Name, Type: st.Type, Size: st.Size, Mode: st.Mode, ModTimeUnixNano: st.ModTimeUnixNano,
		SymlinkTarget: st.SymlinkTarget, Uid: st.Uid, Gid: st.Gid}
}

// Stat implements api.FilesService.
func (s *Service) Stat(ctx context.Context, req *api.StatRequest) (*api.StatResponse, error) {
	a, err := s.agent("stat", req.ContainerId, req.Path)
	if err != nil {
		return nil, errOut(err)
	}
	r, err := a.StatFile(ctx, &protocol.StatFileRequest{ContainerId: req.ContainerId, Path: req.Path})
	if err != nil {
		return nil, errOut(err)
	}
	return &api.StatResponse{Stat: statOf(r.Stat)}, nil
}

// ListDir implements api.FilesService.
func (s *Service) ListDir(ctx context.Context, req *api.ListDirRequest) (*api.ListDirResponse, error) {
	if len(req.After) > 255 {
		return nil, errOut(fmt.Errorf("list %s: after is %d bytes, a name is at most 255: %w", req.Path, len(req.After), errdefs.ErrInvalidArgument))
	}
	a, err := s.agent("list", req.ContainerId, req.Path)
	if err != nil {
		return nil, errOut(err)
	}
	limit := req.Limit
	if limit == 0 || limit > api.MaxDirEntries {
		limit = api.MaxDirEntries
	}
	r, err := a.ListDir(ctx, &protocol.ListDirRequest{ContainerId: req.ContainerId, Path: req.Path, After: req.After, Limit: limit})
	if err != nil {
		return nil, errOut(err)
	}
	out := &api.ListDirResponse{More: r.More}
	for _, e := range r.Entries {
		out.Entries = append(out.Entries, statOf(e))
	}
	return out, nil
}

// Remove implements api.FilesService.
func (s *Service) Remove(ctx context.Context, req *api.RemoveRequest) (*api.RemoveResponse, error) {
	a, err := s.agent("remove", req.ContainerId, req.Path)
	if err != nil {
		return nil, errOut(err)
	}
	if _, err := a.RemoveFile(ctx, &protocol.RemoveFileRequest{ContainerId: req.ContainerId, Path: req.Path, Recursive: req.Recursive}); err != nil {
		return nil, errOut(err)
	}
	return &api.RemoveResponse{}, nil
}

// MakeDir implements api.FilesService.
func (s *Service) MakeDir(ctx context.Context, req *api.MakeDirRequest) (*api.MakeDirResponse, error) {
	if req.Mode > 0o7777 {
		return nil, errOut(fmt.Errorf("make directory %s: mode %o out of range: %w", req.Path, req.Mode, errdefs.ErrInvalidArgument))
	}
	a, err := s.agent("make directory", req.ContainerId, req.Path)
	if err != nil {
		return nil, errOut(err)
	}
	r, err := a.MakeDir(ctx, &protocol.MakeDirRequest{ContainerId: req.ContainerId, Path: req.Path, Mode: req.Mode})
	if err != nil {
		return nil, errOut(err)
	}
	return &api.MakeDirResponse{Created: r.Created}, nil
}
