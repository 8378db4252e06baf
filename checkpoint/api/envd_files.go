package api

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strings"

	"connectrpc.com/connect"
	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/cube-runtime/cube/checkpoint/api/envdpb/filesystem"
)

// envd's filesystem.Filesystem and its HTTP file routes (GET and POST
// /files) over the sandbox's Files (the shim's files service and the guest
// agent's file RPCs), as cube-api's own files routes.

const filesystemService = "/filesystem.Filesystem/"

// filesystemService is filesystem.Filesystem's Connect handler.
func (s *Server) filesystemService(opts ...connect.HandlerOption) (string, http.Handler) {
	mux := http.NewServeMux()
	mux.Handle(filesystemService+"Stat", connect.NewUnaryHandler(filesystemService+"Stat", s.envdStat, opts...))
	mux.Handle(filesystemService+"ListDir", connect.NewUnaryHandler(filesystemService+"ListDir", s.envdListDir, opts...))
	mux.Handle(filesystemService+"MakeDir", connect.NewUnaryHandler(filesystemService+"MakeDir", s.envdMakeDir, opts...))
	mux.Handle(filesystemService+"Remove", connect.NewUnaryHandler(filesystemService+"Remove", s.envdRemove, opts...))
	mux.Handle(filesystemService+"Move", unimplemented[pb.MoveRequest, pb.MoveResponse](filesystemService+"Move", "no rename of files yet: run `mv` with commands.run", opts...))
	mux.Handle(filesystemService+"CreateWatcher", unimplemented[pb.CreateWatcherRequest, pb.CreateWatcherResponse](filesystemService+"CreateWatcher", "no file watches yet", opts...))
	mux.Handle(filesystemService+"GetWatcherEvents", unimplemented[pb.GetWatcherEventsRequest, pb.GetWatcherEventsResponse](filesystemService+"GetWatcherEvents", "no file watches yet", opts...))
	mux.Handle(filesystemService+"RemoveWatcher", unimplemented[pb.RemoveWatcherRequest, pb.RemoveWatcherResponse](filesystemService+"RemoveWatcher", "no file watches yet", opts...))
	mux.Handle(filesystemService+"WatchDir", connect.NewServerStreamHandler(filesystemService+"WatchDir",
		func(context.Context, *connect.Request[pb.WatchDirRequest], *connect.ServerStream[pb.WatchDirResponse]) error {
			return fmt.Errorf("filesystem.Filesystem/WatchDir is not served by cube-api (no file watches yet): %w", errdefs.ErrNotImplemented)
		}, opts...))
	return filesystemService, mux
}

// unimplemented is a unary RPC cube-api does not serve (Connect's unimplemented, saying why).
func unimplemented[Req, Res any](procedure, why string, opts ...connect.HandlerOption) http.Handler {
	return connect.NewUnaryHandler(procedure, func(context.Context, *connect.Request[Req]) (*connect.Response[Res], error) {
		return nil, fmt.Errorf("%s is not served by cube-api (%s): %w", procedure, why, errdefs.ErrNotImplemented)
	}, opts...)
}

// envdFiles is the call's sandbox, refused unless it runs.
func (s *Server) envdFiles(ctx context.Context) (string, error) {
	call, err := envdCallOf(ctx)
	if err != nil {
		return "", err
	}
	return call.sandbox, s.filesReady(ctx, call.sandbox)
}

// envdPath checks a path field of an envd request.
func envdPath(field, p string) (string, error) {
	if err := checkFilePath(field, p); err != nil {
		return "", err
	}
	return p, nil
}

// entryInfo is a file in envd's form: mode is Go's file mode (type bits and
// permissions), as envd sends it.
func entryInfo(fi FileInfo) *pb.EntryInfo {
	mode := fs.FileMode(fi.Mode.Perm())
	typ := pb.FileType_FILE_TYPE_UNSPECIFIED
	switch fi.Type {
	case "file":
		typ = pb.FileType_FILE_TYPE_FILE
	case "dir":
		typ, mode = pb.FileType_FILE_TYPE_DIRECTORY, mode|fs.ModeDir
	case "symlink":
		typ, mode = pb.FileType_FILE_TYPE_SYMLINK, mode|fs.ModeSymlink
	default:
		mode |= fs.ModeIrregular
	}
	e := &pb.EntryInfo{Name: fi.Name, Type: typ, Path: fi.Path, Size: fi.Size, Mode: uint32(mode),
		Permissions: mode.String(), ModifiedTime: timestamppb.New(fi.ModTime)}
	if fi.Type == "symlink" {
		t := fi.Target
		e.SymlinkTarget = &t
	}
	return e
}

func (s *Server) envdStat(ctx context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	p, err := envdPath("path", req.Msg.Path)
	if err != nil {
		return nil, err
	}
	id, err := s.envdFiles(ctx)
	if err != nil {
		return nil, err
	}
	fi, err := s.be.Stat(ctx, id, p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StatResponse{Entry: entryInfo(fi)}), nil
}

// maxListDepth bounds ListDir's depth.
const maxListDepth = 32

func (s *Server) envdListDir(ctx context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	p, err := envdPath("path", req.Msg.Path)
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.Depth)
	if depth == 0 {
		depth = 1
	}
	if depth > maxListDepth {
		return nil, invalid("field \"depth\": %d, at most %d", depth, maxListDepth)
	}
	id, err := s.envdFiles(ctx)
	if err != nil {
		return nil, err
	}
	if fi, err := s.be.Stat(ctx, id, p); err != nil {
		return nil, err
	} else if fi.Type != "dir" {
		return nil, invalid("field \"path\": %s is not a directory", p)
	}
	res := &pb.ListDirResponse{}
	if err := s.listTree(ctx, id, p, depth, &res.Entries); err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

// listTree appends dir's entries, and down to depth levels those of its
// subdirectories (symlinks are not followed).
func (s *Server) listTree(ctx context.Context, id, dir string, depth int, out *[]*pb.EntryInfo) error {
	for after := ""; ; {
		list, more, err := s.be.ListDir(ctx, id, dir, after, MaxListLimit)
		if err != nil {
			return err
		}
		for _, fi := range list {
			*out = append(*out, entryInfo(fi))
			if fi.Type == "dir" && depth > 1 {
				if err := s.listTree(ctx, id, joinPath(dir, fi.Name), depth-1, out); err != nil {
					return err
				}
			}
		}
		if !more || len(list) == 0 {
			return nil
		}
		after = list[len(list)-1].Name
	}
}

func (s *Server) envdMakeDir(ctx context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	p, err := envdPath("path", req.Msg.Path)
	if err != nil {
		return nil, err
	}
	id, err := s.envdFiles(ctx)
	if err != nil {
		return nil, err
	}
	created, err := s.be.MakeDir(ctx, id, p, 0)
	if err != nil {
		return nil, err
	}
	if !created {
		return nil, fmt.Errorf("directory %s exists already: %w", p, errdefs.ErrAlreadyExists)
	}
	fi, err := s.be.Stat(ctx, id, p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.MakeDirResponse{Entry: entryInfo(fi)}), nil
}

func (s *Server) envdRemove(ctx context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	p, err := envdPath("path", req.Msg.Path)
	if err != nil {
		return nil, err
	}
	id, err := s.envdFiles(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.be.Remove(ctx, id, p, true); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}

// envdReadFile is envd's GET /files?path=[&username=]: the file's bytes (as
// GET /sandboxes/{id}/files; the user does not matter: files are read as root).
func (s *Server) envdReadFile(w http.ResponseWriter, r *http.Request) error {
	return s.readFile(w, r)
}

// WriteInfo is envd's answer for a file written.
type WriteInfo struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// envdWriteFile is envd's POST /files?path=[&username=]: a multipart form
// whose "file" parts are files (each named by the query's path, else by its
// filename), or (envd 0.5.7) the raw contents as application/octet-stream,
// gzip-encoded or not. Answers [{name, type, path}].
func (s *Server) envdWriteFile(w http.ResponseWriter, r *http.Request) error {
	qpath := r.URL.Query().Get("path")
	if qpath != "" {
		if err := checkFilePath("path", qpath); err != nil {
			return err
		}
	}
	id, err := s.fileSandbox(r)
	if err != nil {
		return err
	}
	body := io.Reader(r.Body)
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			return invalid("header \"Content-Encoding\": gzip, but the body is not gzip: %v", err)
		}
		defer zr.Close()
		body = zr
	default:
		return invalid("header \"Content-Encoding\": %.32q is not gzip", enc)
	}
	files, err := readUpload(r.Header.Get("Content-Type"), qpath, body, s.cfg.MaxFileBytes)
	if err != nil {
		return err
	}
	out := make([]WriteInfo, 0, len(files))
	for _, f := range files {
		if err := s.putFile(r.Context(), id, f.path, f.data, 0, false); err != nil {
			return err
		}
		out = append(out, WriteInfo{Name: path.Base(f.path), Type: "file", Path: f.path})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// upload is one file of an envd upload.
type upload struct {
	path string
	data []byte
}

// readUpload reads the files of envd's POST /files body: a multipart form's
// "file" parts (path: qpath, else the part's filename) or, of any other
// content type, the body itself (path: qpath). Each file is at most max bytes.
func readUpload(contentType, qpath string, body io.Reader, max int64) ([]upload, error) {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil || mt != "multipart/form-data" {
		if qpath == "" {
			return nil, invalid("query parameter \"path\" is required for a body that is not a multipart form")
		}
		data, err := readBounded(body, max)
		if err != nil {
			return nil, err
		}
		return []upload{{qpath, data}}, nil
	}
	if params["boundary"] == "" {
		return nil, invalid("header \"Content-Type\": multipart/form-data without a boundary")
	}
	mr := multipart.NewReader(body, params["boundary"])
	var files []upload
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			var mb *http.MaxBytesError
			if errors.As(err, &mb) {
				return nil, fileTooLarge{mb}
			}
			return nil, invalid("the multipart body: %v", err)
		}
		// Part.FileName keeps only the base name: the full path is in the header.
		_, dp, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
		if err != nil || dp["name"] != "file" {
			continue
		}
		p := qpath
		if p == "" {
			p = dp["filename"]
			if err := checkFilePath("file's filename", p); err != nil {
				return nil, err
			}
		}
		data, err := readBounded(part, max)
		if err != nil {
			return nil, err
		}
		files = append(files, upload{p, data})
	}
	if len(files) == 0 {
		return nil, invalid("the multipart body has no \"file\" part")
	}
	return files, nil
}

// readBounded reads r whole, refusing more than max bytes (413).
func readBounded(r io.Reader, max int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return nil, fileTooLarge{mb}
		}
		return nil, invalid("read the request body: %v", err)
	}
	if int64(len(data)) > max {
		return nil, fileTooLarge{&http.MaxBytesError{Limit: max}}
	}
	return data, nil
}
