package api

import (
	"context"
	"fmt"
	"io/fs"
	"time"

	"github.com/cube-runtime/cube/checkpoint/shimclient"
	filesapi "github.com/cube-runtime/cube/shim/filesapi"
)

// files dials the shim of sandbox id for its files service; the caller
// closes the client.
func (c *Containerd) files(ctx context.Context, id string) (*shimclient.Client, *shimclient.Files, error) {
	sh, _, err := c.shimOf(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	return sh, sh.Files(), nil
}

// ReadFile implements Files.
func (c *Containerd) ReadFile(ctx context.Context, id, path string, offset int64, length int) (FileChunk, error) {
	sh, f, err := c.files(ctx, id)
	if err != nil {
		return FileChunk{}, err
	}
	defer sh.Close()
	r, err := f.ReadFile(ctx, &filesapi.ReadFileRequest{ContainerId: id, Path: path, Offset: offset, Length: uint32(min(length, MaxFileChunk))})
	if err != nil {
		return FileChunk{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return FileChunk{Data: r.Data, EOF: r.Eof, Size: r.Size}, nil
}

// WriteFile implements Files.
func (c *Containerd) WriteFile(ctx context.Context, id, path string, data []byte, mode fs.FileMode, appending bool) (int64, error) {
	sh, f, err := c.files(ctx, id)
	if err != nil {
		return 0, err
	}
	defer sh.Close()
	r, err := f.WriteFile(ctx, &filesapi.WriteFileRequest{ContainerId: id, Path: path, Data: data, Mode: uint32(mode.Perm()), Append: appending})
	if err != nil {
		return 0, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return r.Size, nil
}

// fileInfo is a FileStat of the shim in directory dir.
func fileInfo(dir string, st *filesapi.FileStat) FileInfo {
	fi := FileInfo{Name: string(st.GetName()), Type: st.GetType(), Size: st.GetSize(), Mode: fs.FileMode(st.GetMode() & 0o777),
		ModTime: time.Unix(0, st.GetModTimeUnixNano()).UTC(), Target: string(st.GetSymlinkTarget())}
	fi.Path = joinPath(dir, fi.Name)
	return fi
}

// Stat implements Files.
func (c *Containerd) Stat(ctx context.Context, id, path string) (FileInfo, error) {
	sh, f, err := c.files(ctx, id)
	if err != nil {
		return FileInfo{}, err
	}
	defer sh.Close()
	r, err := f.Stat(ctx, &filesapi.StatRequest{ContainerId: id, Path: path})
	if err != nil {
		return FileInfo{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	fi := fileInfo("/", r.GetStat())
	fi.Path = path
	return fi, nil
}

// ListDir implements Files.
func (c *Containerd) ListDir(ctx context.Context, id, path, after string, limit int) ([]FileInfo, bool, error) {
	sh, f, err := c.files(ctx, id)
	if err != nil {
		return nil, false, err
	}
	defer sh.Close()
	r, err := f.ListDir(ctx, &filesapi.ListDirRequest{ContainerId: id, Path: path, After: []byte(after), Limit: uint32(limit)})
	if err != nil {
		return nil, false, fmt.Errorf("sandbox %s: %w", id, err)
	}
	out := make([]FileInfo, 0, len(r.Entries))
	for _, e := range r.Entries {
		out = append(out, fileInfo(path, e))
	}
	return out, r.More, nil
}

// Remove implements Files.
func (c *Containerd) Remove(ctx context.Context, id, path string, recursive bool) error {
	sh, f, err := c.files(ctx, id)
	if err != nil {
		return err
	}
	defer sh.Close()
	if _, err := f.Remove(ctx, &filesapi.RemoveRequest{ContainerId: id, Path: path, Recursive: recursive}); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	return nil
}

// MakeDir implements Files.
func (c *Containerd) MakeDir(ctx context.Context, id, path string, mode fs.FileMode) (bool, error) {
	sh, f, err := c.files(ctx, id)
	if err != nil {
		return false, err
	}
	defer sh.Close()
	r, err := f.MakeDir(ctx, &filesapi.MakeDirRequest{ContainerId: id, Path: path, Mode: uint32(mode.Perm())})
	if err != nil {
		return false, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return r.Created, nil
}
