package filessvc

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cube-runtime/cube/guest-agent/protocol"
	api "github.com/cube-runtime/cube/shim/filesapi"
	"github.com/cube-runtime/cube/shim/sandbox"
)

type sbs struct{ err error }

func (s sbs) SandboxOf(id string) (*sandbox.Sandbox, error) {
	if s.err != nil {
		return nil, s.err
	}
	return nil, nil
}

// agent records what reaches the guest agent.
type agent struct{ got []any }

func (a *agent) ReadFile(ctx context.Context, req *protocol.ReadFileRequest) (*protocol.ReadFileResponse, error) {
	a.got = append(a.got, req)
	if req.Path == "/missing" {
		return nil, status.Errorf(codes.NotFound, "read /missing: no such file or directory")
	}
	return &protocol.ReadFileResponse{Data: []byte("abc"), Eof: true, Size: 3}, nil
}

func (a *agent) WriteFile(ctx context.Context, req *protocol.WriteFileRequest) (*protocol.WriteFileResponse, error) {
	a.got = append(a.got, req)
	return &protocol.WriteFileResponse{Size: int64(len(req.Data))}, nil
}

func (a *agent) StatFile(ctx context.Context, req *protocol.StatFileRequest) (*protocol.StatFileResponse, error) {
	a.got = append(a.got, req)
	return &protocol.StatFileResponse{Stat: &protocol.FileStat{Name: []byte("x"), Type: "file", Size: 3, Mode: 0o644}}, nil
}

func (a *agent) ListDir(ctx context.Context, req *protocol.ListDirRequest) (*protocol.ListDirResponse, error) {
	a.got = append(a.got, req)
	return &protocol.ListDirResponse{Entries: []*protocol.FileStat{{Name: []byte("a"), Type: "dir"}}, More: true}, nil
}

func (a *agent) RemoveFile(ctx context.Context, req *protocol.RemoveFileRequest) (*protocol.Empty, error) {
	a.got = append(a.got, req)
	return &protocol.Empty{}, nil
}

func (a *agent) MakeDir(ctx context.Context, req *protocol.MakeDirRequest) (*protocol.MakeDirResponse, error) {
	a.got = append(a.got, req)
	return &protocol.MakeDirResponse{Created: true}, nil
}

func newService(a *agent, err error) *Service {
	return &Service{sbs: sbs{err}, files: func(*sandbox.Sandbox) (sandbox.FileService, error) { return a, nil }}
}

func TestPassesThrough(t *testing.T) {
	a := &agent{}
	s := newService(a, nil)
	ctx := context.Background()
	r, err := s.ReadFile(ctx, &api.ReadFileRequest{ContainerId: "c", Path: "/f", Offset: 2})
	if err != nil || string(r.Data) != "abc" || !r.Eof || r.Size != 3 {
		t.Fatalf("read: %+v %v", r, err)
	}
	if req := a.got[0].(*protocol.ReadFileRequest); req.ContainerId != "c" || req.Offset != 2 || req.Length != api.MaxChunk {
		t.Errorf("the agent got %+v", req)
	}
	if w, err := s.WriteFile(ctx, &api.WriteFileRequest{ContainerId: "c", Path: "/d/f", Data: []byte("xy"), Append: true}); err != nil || w.Size != 2 {
		t.Fatalf("write: %+v %v", w, err)
	}
	if req := a.got[1].(*protocol.WriteFileRequest); !req.MakeParents || !req.Append || req.ContainerId != "c" {
		t.Errorf("the agent got %+v", req)
	}
	if st, err := s.Stat(ctx, &api.StatRequest{ContainerId: "c", Path: "/f"}); err != nil || st.Stat.Type != "file" || st.Stat.Mode != 0o644 {
		t.Errorf("stat: %+v %v", st, err)
	}
	if l, err := s.ListDir(ctx, &api.ListDirRequest{ContainerId: "c", Path: "/", Limit: 10000}); err != nil || len(l.Entries) != 1 || !l.More {
		t.Errorf("list: %+v %v", l, err)
	}
	if req := a.got[3].(*protocol.ListDirRequest); req.Limit != api.MaxDirEntries {
		t.Errorf("list limit %d", req.Limit)
	}
	if _, err := s.Remove(ctx, &api.RemoveRequest{ContainerId: "c", Path: "/d", Recursive: true}); err != nil || !a.got[4].(*protocol.RemoveFileRequest).Recursive {
		t.Errorf("remove: %v", err)
	}
	if m, err := s.MakeDir(ctx, &api.MakeDirRequest{ContainerId: "c", Path: "/n", Mode: 0o700}); err != nil || !m.Created {
		t.Errorf("mkdir: %+v %v", m, err)
	}
	// The agent's status keeps its code.
	_, err = s.ReadFile(ctx, &api.ReadFileRequest{ContainerId: "c", Path: "/missing"})
	if !errdefs.IsNotFound(errgrpc.ToNative(err)) || !strings.Contains(err.Error(), "/missing") {
		t.Errorf("missing file: %v", err)
	}
}

func TestRefusesBadRequests(t *testing.T) {
	a := &agent{}
	s := newService(a, nil)
	ctx := context.Background()
	for name, err := range map[string]error{
		"no container":  second(s.Stat(ctx, &api.StatRequest{Path: "/f"})),
		"relative path": second(s.Stat(ctx, &api.StatRequest{ContainerId: "c", Path: "f"})),
		"empty path":    second(s.Remove(ctx, &api.RemoveRequest{ContainerId: "c"})),
		"NUL":           second(s.MakeDir(ctx, &api.MakeDirRequest{ContainerId: "c", Path: "/a\x00b"})),
		"not UTF-8":     second(s.ListDir(ctx, &api.ListDirRequest{ContainerId: "c", Path: "/\xff"})),
		"long path":     second(s.Stat(ctx, &api.StatRequest{ContainerId: "c", Path: "/" + strings.Repeat("a", api.MaxPath)})),
		"offset":        second(s.ReadFile(ctx, &api.ReadFileRequest{ContainerId: "c", Path: "/f", Offset: -1})),
		"big write":     second(s.WriteFile(ctx, &api.WriteFileRequest{ContainerId: "c", Path: "/f", Data: make([]byte, api.MaxChunk+1)})),
		"mode":          second(s.MakeDir(ctx, &api.MakeDirRequest{ContainerId: "c", Path: "/d", Mode: 0o10000})),
		"after":         second(s.ListDir(ctx, &api.ListDirRequest{ContainerId: "c", Path: "/", After: make([]byte, 256)})),
	} {
		if !errdefs.IsInvalidArgument(errgrpc.ToNative(err)) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if len(a.got) != 0 {
		t.Errorf("bad requests reached the agent: %+v", a.got)
	}
	s = newService(a, errors.Join(errors.New("container c not found"), errdefs.ErrNotFound))
	if _, err := s.Stat(ctx, &api.StatRequest{ContainerId: "c", Path: "/f"}); !errdefs.IsNotFound(errgrpc.ToNative(err)) {
		t.Errorf("unknown container: %v", err)
	}
}

func second[T any](_ T, err error) error { return err }
