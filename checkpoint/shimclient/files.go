package shimclient

import (
	"context"

	"github.com/containerd/errdefs/pkg/errgrpc"

	filesapi "github.com/cube-runtime/cube/shim/filesapi"
)

// Files is the shim's files service (cube.files.v1) on a Client's
// connection. Its errors carry errdefs classes and the shim's (or the
// guest agent's) message.
type Files struct {
	s filesapi.FilesService
}

// Files returns the files service on the same connection.
func (c *Client) Files() *Files { return &Files{s: filesapi.NewFilesClient(c.c)} }

// ReadFile calls the service's ReadFile.
func (f *Files) ReadFile(ctx context.Context, req *filesapi.ReadFileRequest) (*filesapi.ReadFileResponse, error) {
	r, err := f.s.ReadFile(ctx, req)
	return r, errgrpc.ToNative(err)
}

// WriteFile calls the service's WriteFile.
func (f *Files) WriteFile(ctx context.Context, req *filesapi.WriteFileRequest) (*filesapi.WriteFileResponse, error) {
	r, err := f.s.WriteFile(ctx, req)
	return r, errgrpc.ToNative(err)
}

// Stat calls the service's Stat.
func (f *Files) Stat(ctx context.Context, req *filesapi.StatRequest) (*filesapi.StatResponse, error) {
	r, err := f.s.Stat(ctx, req)
	return r, errgrpc.ToNative(err)
}

// ListDir calls the service's ListDir.
func (f *Files) ListDir(ctx context.Context, req *filesapi.ListDirRequest) (*filesapi.ListDirResponse, error) {
	r, err := f.s.ListDir(ctx, req)
	return r, errgrpc.ToNative(err)
}

// Remove calls the service's Remove.
func (f *Files) Remove(ctx context.Context, req *filesapi.RemoveRequest) (*filesapi.RemoveResponse, error) {
	r, err := f.s.Remove(ctx, req)
	return r, errgrpc.ToNative(err)
}

// MakeDir calls the service's MakeDir.
func (f *Files) MakeDir(ctx context.Context, req *filesapi.MakeDirRequest) (*filesapi.MakeDirResponse, error) {
	r, err := f.s.MakeDir(ctx, req)
	return r, errgrpc.ToNative(err)
}
