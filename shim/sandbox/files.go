package sandbox

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/guest-agent/protocol"
)

// FileService is the guest agent's file RPCs (those of the generated
// client: the shim's files service passes requests through).
type FileService interface {
	ReadFile(ctx context.Context, req *protocol.ReadFileRequest) (*protocol.ReadFileResponse, error)
	WriteFile(ctx context.Context, req *protocol.WriteFileRequest) (*protocol.WriteFileResponse, error)
	StatFile(ctx context.Context, req *protocol.StatFileRequest) (*protocol.StatFileResponse, error)
	ListDir(ctx context.Context, req *protocol.ListDirRequest) (*protocol.ListDirResponse, error)
	RemoveFile(ctx context.Context, req *protocol.RemoveFileRequest) (*protocol.Empty, error)
	MakeDir(ctx context.Context, req *protocol.MakeDirRequest) (*protocol.MakeDirResponse, error)
}

// fileAgent is an AgentClient that reaches the agent's file RPCs.
type fileAgent interface {
	fileService() FileService
}

func (a *protocolAgent) fileService() FileService { return a.c }

// Files returns the guest agent's file RPCs of the running VM (its agent
// client of now: a rollback or restore re-dials it). FailedPrecondition
// when the VM is not running, NotImplemented for an agent client without
// them (a test's fake).
func (s *Sandbox) Files() (FileService, error) {
	if st := s.State(); st != StateRunning {
		return nil, fmt.Errorf("sandbox %s: its VM is %s: the guest agent answers only while it runs (resume it first): %w", s.ID(), st, errdefs.ErrFailedPrecondition)
	}
	a := s.Agent()
	if a == nil {
		return nil, fmt.Errorf("sandbox %s: the guest agent is not connected: %w", s.ID(), errdefs.ErrFailedPrecondition)
	}
	f, ok := a.(fileAgent)
	if !ok {
		return nil, fmt.Errorf("sandbox %s: agent client %T has no file RPCs: %w", s.ID(), a, errdefs.ErrNotImplemented)
	}
	return f.fileService(), nil
}
