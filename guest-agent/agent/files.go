package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"

	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/guest-agent/protocol"
)

// The file RPCs beside ReadFile and WriteFile (system.go): every path is
// resolved inside the root (RESOLVE_IN_ROOT: a container's symlinks and
// ".." stay in it), and nothing here follows the last element's symlink.

// statAt describes name in directory dir (AT_SYMLINK_NOFOLLOW); name ""
// describes dir itself (an O_PATH fd, AT_EMPTY_PATH).
func statAt(dir int, name string) (*protocol.FileStat, error) {
	var st unix.Stat_t
	flags := unix.AT_SYMLINK_NOFOLLOW
	if name == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	if err := unix.Fstatat(dir, name, &st, flags); err != nil {
		return nil, err
	}
	fs := &protocol.FileStat{Name: []byte(name), Size: st.Size, Mode: st.Mode & 0o7777,
		ModTimeUnixNano: st.Mtim.Nano(), Uid: st.Uid, Gid: st.Gid}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		fs.Type = "file"
	case unix.S_IFDIR:
		fs.Type = "dir"
	case unix.S_IFLNK:
		fs.Type = "symlink"
		buf := make([]byte, maxPath)
		n, err := unix.Readlinkat(dir, name, buf)
		if err != nil {
			return nil, err
		}
		fs.SymlinkTarget = buf[:n]
	default:
		fs.Type = "other"
	}
	return fs, nil
}

func (s *Service) StatFile(ctx context.Context, req *protocol.StatFileRequest) (*protocol.StatFileResponse, error) {
	if err := validFilePath(req.Path); err != nil {
		return nil, errInvalid("%v", err)
	}
	root, err := s.openRoot(req.ContainerId)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	fd, err := openIn(root, req.Path, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, toStatus(err, "stat %s", req.Path)
	}
	defer unix.Close(fd)
	st, err := statAt(fd, "")
	if err != nil {
		return nil, toStatus(err, "stat %s", req.Path)
	}
	st.Name = []byte(filepath.Base(req.Path))
	return &protocol.StatFileResponse{Stat: st}, nil
}

func (s *Service) ListDir(ctx context.Context, req *protocol.ListDirRequest) (*protocol.ListDirResponse, error) {
	if err := validFilePath(req.Path); err != nil {
		return nil, errInvalid("%v", err)
	}
	limit := int(req.Limit)
	if limit == 0 || limit > protocol.MaxDirEntries {
		limit = protocol.MaxDirEntries
	}
	root, err := s.openRoot(req.ContainerId)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	fd, err := openIn(root, req.Path, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, toStatus(err, "list %s", req.Path)
	}
	dir := os.NewFile(uintptr(fd), req.Path)
	defer dir.Close()
	names, err := readNames(dir)
	if err != nil {
		return nil, toStatus(err, "list %s", req.Path)
	}
	sort.Strings(names)
	start := sort.Search(len(names), func(i int) bool { return bytes.Compare([]byte(names[i]), req.After) > 0 })
	resp := &protocol.ListDirResponse{}
	for _, n := range names[start:] {
		if len(resp.Entries) == limit {
			resp.More = true
			break
		}
		st, err := statAt(fd, n)
		if errors.Is(err, unix.ENOENT) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, toStatus(err, "list %s: %q", req.Path, n)
		}
		resp.Entries = append(resp.Entries, st)
	}
	return resp, nil
}

// maxDirNames bounds the names ListDir sorts (its memory: a page is cut
// from all of them).
const maxDirNames = 1 << 20

// readNames reads a directory's names, at most maxDirNames.
func readNames(dir *os.File) ([]string, error) {
	var names []string
	for {
		batch, err := dir.Readdirnames(4096)
		names = append(names, batch...)
		if len(names) > maxDirNames {
			return nil, errInvalid("the directory has more than %d entries: too many to list", maxDirNames)
		}
		if errors.Is(err, io.EOF) || (err == nil && len(batch) == 0) {
			return names, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// parentIn opens the parent directory of p in root and returns it with
// p's last element, refusing a path whose last element is not a name
// ("/", ".", "..").
func parentIn(root int, p string) (int, string, error) {
	p = filepath.Clean(p)
	base := filepath.Base(p)
	if base == "/" || base == "." || base == ".." {
		return -1, "", errInvalid("path %q names no file in a directory", p)
	}
	fd, err := openIn(root, filepath.Dir(p), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, "", err
	}
	return fd, base, nil
}

func (s *Service) RemoveFile(ctx context.Context, req *protocol.RemoveFileRequest) (*protocol.Empty, error) {
	if err := validFilePath(req.Path); err != nil {
		return nil, errInvalid("%v", err)
	}
	root, err := s.openRoot(req.ContainerId)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	parent, name, err := parentIn(root, req.Path)
	if err != nil {
		return nil, toStatus(err, "remove %s", req.Path)
	}
	defer unix.Close(parent)
	err = unix.Unlinkat(parent, name, 0)
	if errors.Is(err, unix.EISDIR) {
		err = unix.Unlinkat(parent, name, unix.AT_REMOVEDIR)
		if (errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST)) && req.Recursive {
			err = removeAllAt(parent, name, 0)
		} else if errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
			return nil, errState("remove %s: the directory is not empty (remove it recursively)", req.Path)
		}
	}
	if err != nil {
		return nil, toStatus(err, "remove %s", req.Path)
	}
	return &protocol.Empty{}, nil
}

// maxRemoveDepth bounds removeAllAt's recursion.
const maxRemoveDepth = 256

// removeAllAt removes directory name in dir and everything in it; each
// step is relative to an fd of its directory, opened without following a
// symlink, so nothing outside the tree is touched.
func removeAllAt(dir int, name string, depth int) error {
	if depth > maxRemoveDepth {
		return unix.ELOOP
	}
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	for {
		names, err := f.Readdirnames(1024)
		for _, n := range names {
			err := unix.Unlinkat(fd, n, 0)
			if errors.Is(err, unix.EISDIR) {
				err = removeAllAt(fd, n, depth+1)
			}
			if err != nil && !errors.Is(err, unix.ENOENT) {
				return err
			}
		}
		if len(names) == 0 || err != nil {
			break
		}
	}
	return unix.Unlinkat(dir, name, unix.AT_REMOVEDIR)
}

func (s *Service) MakeDir(ctx context.Context, req *protocol.MakeDirRequest) (*protocol.MakeDirResponse, error) {
	if err := validFilePath(req.Path); err != nil {
		return nil, errInvalid("%v", err)
	}
	if req.Mode > 0o7777 {
		return nil, errInvalid("mode %o out of range", req.Mode)
	}
	mode := req.Mode
	if mode == 0 {
		mode = 0o755
	}
	root, err := s.openRoot(req.ContainerId)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	if err := mkdirAllIn(root, filepath.Dir(filepath.Clean(req.Path))); err != nil {
		return nil, toStatus(err, "make the parents of %s", req.Path)
	}
	parent, name, err := parentIn(root, req.Path)
	if err != nil {
		return nil, toStatus(err, "make directory %s", req.Path)
	}
	defer unix.Close(parent)
	err = unix.Mkdirat(parent, name, mode)
	if errors.Is(err, unix.EEXIST) {
		st, serr := statAt(parent, name)
		if serr == nil && st.Type == "dir" {
			return &protocol.MakeDirResponse{Created: false}, nil
		}
		return nil, toStatus(err, "make directory %s: a %s is there", req.Path, fileType(st))
	}
	if err != nil {
		return nil, toStatus(err, "make directory %s", req.Path)
	}
	// The umask narrowed mode: set it as asked.
	if err := unix.Fchmodat(parent, name, mode, 0); err != nil {
		return nil, toStatus(err, "chmod %s", req.Path)
	}
	return &protocol.MakeDirResponse{Created: true}, nil
}

func fileType(st *protocol.FileStat) string {
	if st == nil {
		return "file"
	}
	return st.Type
}
