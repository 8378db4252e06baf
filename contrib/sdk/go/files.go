package cube

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"time"
)

// Files are a sandbox's files (E2B's files.read/write/list/remove/make_dir
// and get_info). Paths are absolute in the sandbox's root.
type Files struct{ s *Sandbox }

// EntryInfo describes a file.
type EntryInfo struct {
	Name string `json:"name"`
	Path string `json:"path"`
	// Type is "file", "dir", "symlink" or "other".
	Type          string    `json:"type"`
	Size          int64     `json:"size"`
	Mode          uint32    `json:"mode"`
	Permissions   string    `json:"permissions"`
	ModifiedTime  time.Time `json:"modifiedTime"`
	SymlinkTarget string    `json:"symlinkTarget,omitempty"`
}

func pathQuery(path string, kv ...string) url.Values {
	q := url.Values{"path": {path}}
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	return q
}

// Read returns a file's contents (at most the server's max_file_bytes;
// ReadRange reads a larger one in parts).
func (f *Files) Read(ctx context.Context, path string) ([]byte, error) {
	return f.read(ctx, pathQuery(path))
}

// ReadRange returns up to length bytes of a file from offset.
func (f *Files) ReadRange(ctx context.Context, path string, offset, length int64) ([]byte, error) {
	return f.read(ctx, pathQuery(path, "offset", strconv.FormatInt(offset, 10), "length", strconv.FormatInt(length, 10)))
}

func (f *Files) read(ctx context.Context, q url.Values) ([]byte, error) {
	resp, err := f.s.c.sendRaw(ctx, "GET", f.s.path("/files"), q, "", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("cube-api: read %s: %w", q.Get("path"), err)
	}
	if size := resp.Header.Get("X-File-Size"); q.Get("length") == "" && size != strconv.Itoa(len(b)) {
		return nil, fmt.Errorf("cube-api: read %s: got %d bytes of %s (the file changed, or the read broke off)", q.Get("path"), len(b), size)
	}
	return b, nil
}

// WriteOptions: the mode of a new file (0: 0644), append instead of replace.
type WriteOptions struct {
	Mode   uint32
	Append bool
}

// Write writes data as a file (making its missing parent directories) and
// returns its description.
func (f *Files) Write(ctx context.Context, path string, data []byte, o ...WriteOptions) (*EntryInfo, error) {
	q := pathQuery(path)
	if len(o) > 0 {
		if o[0].Mode != 0 {
			q.Set("mode", strconv.FormatUint(uint64(o[0].Mode), 8))
		}
		if o[0].Append {
			q.Set("append", "true")
		}
	}
	resp, err := f.s.c.sendRaw(ctx, "PUT", f.s.path("/files"), q, "application/octet-stream", bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var ei EntryInfo
	if err := json.NewDecoder(resp.Body).Decode(&ei); err != nil {
		return nil, fmt.Errorf("cube-api: write %s: decode the answer: %w", path, err)
	}
	return &ei, nil
}

// GetInfo describes a file (a symlink itself).
func (f *Files) GetInfo(ctx context.Context, path string) (*EntryInfo, error) {
	var ei EntryInfo
	if _, err := f.s.c.call(ctx, "GET", f.s.path("/files/stat"), pathQuery(path), nil, &ei); err != nil {
		return nil, err
	}
	return &ei, nil
}

// Exists says whether path exists.
func (f *Files) Exists(ctx context.Context, path string) (bool, error) {
	_, err := f.GetInfo(ctx, path)
	if IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// List returns a directory's entries by name (every page).
func (f *Files) List(ctx context.Context, path string) ([]EntryInfo, error) {
	var all []EntryInfo
	for next := ""; ; {
		q := pathQuery(path)
		if next != "" {
			q.Set("nextToken", next)
		}
		var page []EntryInfo
		h, err := f.s.c.call(ctx, "GET", f.s.path("/files/list"), q, nil, &page)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if next = h.Get("X-Next-Token"); next == "" {
			return all, nil
		}
	}
}

// Remove removes a file, a symlink or an empty directory; recursive removes
// a directory and everything in it.
func (f *Files) Remove(ctx context.Context, path string, recursive ...bool) error {
	q := pathQuery(path)
	if len(recursive) > 0 && recursive[0] {
		q.Set("recursive", "true")
	}
	_, err := f.s.c.call(ctx, "DELETE", f.s.path("/files"), q, nil, nil)
	return err
}

// MakeDir makes a directory and its missing parents; false when it existed.
func (f *Files) MakeDir(ctx context.Context, path string) (bool, error) {
	var out struct {
		Created bool `json:"created"`
	}
	if _, err := f.s.c.call(ctx, "POST", f.s.path("/files/dir"), pathQuery(path), nil, &out); err != nil {
		return false, err
	}
	return out.Created, nil
}
