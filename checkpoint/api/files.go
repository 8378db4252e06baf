package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/containerd/errdefs"
)

// The files of a sandbox (E2B's files.read/write/list/remove/make_dir and
// stat): paths are absolute in the sandbox container's root, given in the
// query parameter "path" (percent-encoded: any UTF-8 but NUL); file contents
// travel raw (application/octet-stream) and are bounded by max_file_bytes.

// EntryInfo is a file as the API shows it (E2B's EntryInfo names).
type EntryInfo struct {
	Name string `json:"name"`
	Path string `json:"path"`
	// Type is "file", "dir", "symlink" or "other".
	Type string `json:"type"`
	Size int64  `json:"size"`
	// Mode is the permission bits (0644 is 420); Permissions the same as ls shows them.
	Mode          uint32    `json:"mode"`
	Permissions   string    `json:"permissions"`
	ModifiedTime  time.Time `json:"modifiedTime"`
	SymlinkTarget string    `json:"symlinkTarget,omitempty"`
}

// MakeDirInfo is POST …/files/dir's answer.
type MakeDirInfo struct {
	Path string `json:"path"`
	// Created is false when the directory existed.
	Created bool `json:"created"`
}

// Bounds of the file routes.
const (
	maxFilePath = 4096
	// DefaultListLimit and MaxListLimit bound a page of …/files/list.
	DefaultListLimit = 500
	MaxListLimit     = 500
)

// FileSizeHeader carries the file's size in a read's answer.
const FileSizeHeader = "X-File-Size"

func entryOf(fi FileInfo) EntryInfo {
	perm := fs.FileMode(fi.Mode.Perm())
	switch fi.Type {
	case "dir":
		perm |= fs.ModeDir
	case "symlink":
		perm |= fs.ModeSymlink
	case "other":
		perm |= fs.ModeIrregular
	}
	return EntryInfo{Name: fi.Name, Path: fi.Path, Type: fi.Type, Size: fi.Size, Mode: uint32(fi.Mode.Perm()),
		Permissions: perm.String(), ModifiedTime: fi.ModTime, SymlinkTarget: fi.Target}
}

// joinPath is dir/name for an absolute dir.
func joinPath(dir, name string) string {
	if strings.HasSuffix(dir, "/") {
		return dir + name
	}
	return dir + "/" + name
}

// filePath reads and checks the query parameter "path".
func filePath(q url.Values) (string, error) {
	p := q.Get("path")
	if err := checkFilePath("query parameter \"path\"", p); err != nil {
		return "", err
	}
	return p, nil
}

// checkFilePath checks a file path given in what (a field, a parameter).
func checkFilePath(what, p string) error {
	if !strings.Contains(what, " ") {
		what = fmt.Sprintf("field %q", what)
	}
	switch {
	case p == "":
		return invalid("%s is required", what)
	case p[0] != '/':
		return invalid("%s: %.64q is not absolute (paths are in the sandbox's root: /home/user/f)", what, p)
	case len(p) > maxFilePath:
		return invalid("%s: %d bytes, at most %d", what, len(p), maxFilePath)
	case strings.ContainsRune(p, 0) || !utf8.ValidString(p):
		return invalid("%s: %.64q holds NUL or is not UTF-8", what, p)
	}
	return nil
}

// intParam reads an optional non-negative integer query parameter.
func intParam(q url.Values, name string, max int64) (int64, bool, error) {
	v := q.Get(name)
	if v == "" {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > max {
		return 0, false, invalid("query parameter %q: %q is not a whole number in 0..%d", name, v, max)
	}
	return n, true, nil
}

// boolParam reads an optional true/false query parameter.
func boolParam(q url.Values, name string) (bool, error) {
	v := q.Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, invalid("query parameter %q: %q is not true or false", name, v)
	}
	return b, nil
}

// modeParam reads an optional octal mode ("0644", "755").
func modeParam(q url.Values) (fs.FileMode, error) {
	v := q.Get("mode")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 8, 32)
	if err != nil || n > 0o777 {
		return 0, invalid("query parameter \"mode\": %q is not octal permission bits 0..0777", v)
	}
	return fs.FileMode(n), nil
}

// fileSandbox checks that sandbox id exists and runs (its guest answers).
func (s *Server) fileSandbox(r *http.Request) (string, error) {
	id := r.PathValue("sandboxID")
	return id, s.filesReady(r.Context(), id)
}

// filesReady checks that sandbox id exists and runs.
func (s *Server) filesReady(ctx context.Context, id string) error {
	c, err := s.be.Get(ctx, id)
	if err != nil {
		return err
	}
	if st := stateOf(c.Status); st != "running" {
		return fmt.Errorf("sandbox %s is %s: its files are reached while it runs (POST /sandboxes/%s/connect resumes it): %w", id, st, id, errdefs.ErrConflict)
	}
	return nil
}

// readFile is GET /sandboxes/{id}/files?path=[&offset=&length=]: the file's
// bytes (all of it, or length bytes from offset), at most max_file_bytes.
func (s *Server) readFile(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	path, err := filePath(q)
	if err != nil {
		return err
	}
	offset, _, err := intParam(q, "offset", 1<<62)
	if err != nil {
		return err
	}
	length, hasLength, err := intParam(q, "length", s.cfg.MaxFileBytes)
	if err != nil {
		return err
	}
	id, err := s.fileSandbox(r)
	if err != nil {
		return err
	}
	want := s.cfg.MaxFileBytes
	if hasLength {
		want = length
	}
	// The first chunk before the header: an error gets its status.
	ch, err := s.be.ReadFile(r.Context(), id, path, offset, int(min(want, MaxFileChunk)))
	if err != nil {
		return err
	}
	if !hasLength && ch.Size-offset > s.cfg.MaxFileBytes {
		return invalid("query parameter \"path\": %s is %d bytes, more than max_file_bytes (%d): read it in parts with the query parameters offset and length",
			path, ch.Size, s.cfg.MaxFileBytes)
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set(FileSizeHeader, strconv.FormatInt(ch.Size, 10))
	w.WriteHeader(http.StatusOK)
	for sent := int64(0); ; {
		if _, err := w.Write(ch.Data); err != nil {
			return nil // the client left
		}
		sent += int64(len(ch.Data))
		offset += int64(len(ch.Data))
		if ch.EOF || len(ch.Data) == 0 || sent >= want {
			return nil
		}
		if ch, err = s.be.ReadFile(r.Context(), id, path, offset, int(min(want-sent, MaxFileChunk))); err != nil {
			// The status is sent: end the body short (the client sees fewer than X-File-Size bytes).
			logOf(r).WithError(err).WithField("sandbox", id).Warn("read file: a later chunk failed")
			panic(http.ErrAbortHandler)
		}
	}
}

// writeFile is PUT /sandboxes/{id}/files?path=[&mode=][&append=]: the body
// (at most max_file_bytes) becomes the file (or is appended to it); its
// missing parent directories are made. Answers the file's EntryInfo.
func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	path, err := filePath(q)
	if err != nil {
		return err
	}
	mode, err := modeParam(q)
	if err != nil {
		return err
	}
	appending, err := boolParam(q, "append")
	if err != nil {
		return err
	}
	id, err := s.fileSandbox(r)
	if err != nil {
		return err
	}
	// The whole body first: a body that is too large (413) leaves the file as it was.
	var buf bytes.Buffer
	if _, err := io.Copy(&buf, r.Body); err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return fileTooLarge{mb}
		}
		return invalid("read the request body: %v", err)
	}
	if err := s.putFile(r.Context(), id, path, buf.Bytes(), mode, appending); err != nil {
		return err
	}
	fi, err := s.be.Stat(r.Context(), id, path)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, entryOf(fi))
	return nil
}

// putFile writes data to path in chunks (the file replaced, or appended to).
func (s *Server) putFile(ctx context.Context, id, path string, data []byte, mode fs.FileMode, appending bool) error {
	for first := true; first || len(data) > 0; first = false {
		n := min(len(data), MaxFileChunk)
		if _, err := s.be.WriteFile(ctx, id, path, data[:n], mode, appending || !first); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// fileTooLarge is a write's body beyond max_file_bytes (413).
type fileTooLarge struct{ mb *http.MaxBytesError }

func (e fileTooLarge) Error() string {
	return fmt.Sprintf("request body: the file is larger than %d bytes (max_file_bytes): write it in parts with append=true", e.mb.Limit)
}
func (e fileTooLarge) Unwrap() error { return e.mb }

func (s *Server) statFile(w http.ResponseWriter, r *http.Request) error {
	path, err := filePath(r.URL.Query())
	if err != nil {
		return err
	}
	id, err := s.fileSandbox(r)
	if err != nil {
		return err
	}
	fi, err := s.be.Stat(r.Context(), id, path)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, entryOf(fi))
	return nil
}

// listDir is GET /sandboxes/{id}/files/list?path=&limit=&nextToken=: the
// directory's entries by name, a page at a time (the next page's token in
// X-Next-Token: the page's last name).
func (s *Server) listDir(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	path, err := filePath(q)
	if err != nil {
		return err
	}
	limit, hasLimit, err := intParam(q, "limit", MaxListLimit)
	if err != nil {
		return err
	}
	if !hasLimit || limit == 0 {
		limit = DefaultListLimit
	}
	after := q.Get("nextToken")
	if len(after) > 255 || strings.ContainsAny(after, "/\x00") {
		return invalid("query parameter \"nextToken\": not a token of this route")
	}
	id, err := s.fileSandbox(r)
	if err != nil {
		return err
	}
	list, more, err := s.be.ListDir(r.Context(), id, path, after, int(limit))
	if err != nil {
		return err
	}
	out := make([]EntryInfo, 0, len(list))
	for _, fi := range list {
		out = append(out, entryOf(fi))
	}
	if more && len(list) > 0 {
		w.Header().Set(NextTokenHeader, list[len(list)-1].Name)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// removeFile is DELETE /sandboxes/{id}/files?path=[&recursive=] → 204.
func (s *Server) removeFile(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	path, err := filePath(q)
	if err != nil {
		return err
	}
	recursive, err := boolParam(q, "recursive")
	if err != nil {
		return err
	}
	id, err := s.fileSandbox(r)
	if err != nil {
		return err
	}
	if err := s.be.Remove(r.Context(), id, path, recursive); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// makeDir is POST /sandboxes/{id}/files/dir?path=[&mode=]: 201 when made,
// 200 when it existed.
func (s *Server) makeDir(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	path, err := filePath(q)
	if err != nil {
		return err
	}
	mode, err := modeParam(q)
	if err != nil {
		return err
	}
	id, err := s.fileSandbox(r)
	if err != nil {
		return err
	}
	created, err := s.be.MakeDir(r.Context(), id, path, mode)
	if err != nil {
		return err
	}
	code := http.StatusOK
	if created {
		code = http.StatusCreated
	}
	writeJSON(w, code, MakeDirInfo{Path: path, Created: created})
	return nil
}
