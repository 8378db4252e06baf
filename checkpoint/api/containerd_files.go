package api

import (
	"context"
	"fmt"
	"io/fs"

	"github.com/containerd/errdefs"
)

func filesNotYet(id string) error {
	return fmt.Errorf("sandbox %s: files are not implemented yet: %w", id, errdefs.ErrNotImplemented)
}

// ReadFile implements Files.
func (c *Containerd) ReadFile(ctx context.Context, id, path string, offset int64, length int) (FileChunk, error) {
	return FileChunk{}, filesNotYet(id)
}

// WriteFile implements Files.
func (c *Containerd) WriteFile(ctx context.Context, id, path string, data []byte, mode fs.FileMode, appending bool) (int64, error) {
	return 0, filesNotYet(id)
}

// Stat implements Files.
func (c *Containerd) Stat(ctx context.Context, id, path string) (FileInfo, error) {
	return FileInfo{}, filesNotYet(id)
}

// ListDir implements Files.
func (c *Containerd) ListDir(ctx context.Context, id, path, after string, limit int) ([]FileInfo, bool, error) {
	return nil, false, filesNotYet(id)
}

// Remove implements Files.
func (c *Containerd) Remove(ctx context.Context, id, path string, recursive bool) error {
	return filesNotYet(id)
}

// MakeDir implements Files.
func (c *Containerd) MakeDir(ctx context.Context, id, path string, mode fs.FileMode) (bool, error) {
	return false, filesNotYet(id)
}
