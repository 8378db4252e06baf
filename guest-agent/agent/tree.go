package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/guest-agent/protocol"
)

// Volumes copied from the host (SyncTree) and pod volumes that live in the
// guest (PrepareVolume). Every path below the configured roots is resolved
// with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS or O_NOFOLLOW: a symbolic link in
// a tree (the kubelet's "..data", or anything a container could make) is
// data, never followed.

var tmpSeq atomic.Uint64

// beneath opens rel (relative, clean) under dir without following links.
func beneath(dir int, rel string, flags uint64) (int, error) {
	return unix.Openat2(dir, rel, &unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
}

// openRootDir opens root (the agent's own directory, made if missing).
func openRootDir(root string) (int, error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return -1, err
	}
	return unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

// mkdirBeneath makes rel's missing components under base (mode 0755, the
// last one mode) and returns the last one opened read-only.
func mkdirBeneath(base int, rel string, mode uint32) (int, error) {
	cur, err := unix.Dup(base)
	if err != nil {
		return -1, err
	}
	parts := strings.Split(rel, "/")
	for i, c := range parts {
		m := uint32(0o755)
		if i == len(parts)-1 {
			m = mode
		}
		if err := unix.Mkdirat(cur, c, m); err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(cur)
			return -1, err
		}
		next, err := beneath(cur, c, unix.O_RDONLY|unix.O_DIRECTORY)
		unix.Close(cur)
		if err != nil {
			return -1, err
		}
		cur = next
	}
	return cur, nil
}

// SyncTree implements protocol.AgentService (see agent.proto).
func (s *Service) SyncTree(ctx context.Context, req *protocol.SyncTreeRequest) (*protocol.SyncTreeResponse, error) {
	if err := validVolumeDir(req.GetDir(), s.cfg.VolumeRoot); err != nil {
		return nil, errInvalid("sync tree: %v", err)
	}
	pl, err := planTree(req)
	if err != nil {
		return nil, errInvalid("sync tree %s: %v", req.GetDir(), err)
	}
	s.treeMu.Lock()
	defer s.treeMu.Unlock()
	root, err := openRootDir(s.cfg.VolumeRoot)
	if err != nil {
		return nil, toStatus(err, "sync tree %s: open %s", req.GetDir(), s.cfg.VolumeRoot)
	}
	defer unix.Close(root)
	rel := strings.TrimPrefix(req.GetDir(), s.cfg.VolumeRoot+"/")
	top, err := mkdirBeneath(root, rel, 0o755)
	if err != nil {
		return nil, toStatus(err, "sync tree: make %s", req.GetDir())
	}
	a := &treeApply{dirs: map[string]int{".": top}}
	defer a.close()
	if _, err := a.setAttrs(top, req.GetMode(), req.GetUid(), req.GetGid()); err != nil {
		return nil, toStatus(err, "sync tree %s", req.GetDir())
	}
	if err := a.apply(pl); err != nil {
		return nil, toStatus(err, "sync tree %s", req.GetDir())
	}
	return &protocol.SyncTreeResponse{Written: a.written, Removed: a.removed}, nil
}

// treeApply is one SyncTree in progress: the directories opened so far.
type treeApply struct {
	dirs             map[string]int
	written, removed uint32
}

func (a *treeApply) close() {
	for _, fd := range a.dirs {
		unix.Close(fd)
	}
}

// Ordering: directories and files first (invisible until a link points at
// them, or each swapped in by one rename), then links ("..data" first),
// then what is no longer listed — the kubelet's own order.
func (a *treeApply) apply(pl *treePlan) error {
	for _, e := range pl.dirs {
		if err := a.dir(e); err != nil {
			return fmt.Errorf("directory %s: %w", e.GetPath(), err)
		}
	}
	for _, e := range pl.files {
		if err := a.file(e); err != nil {
			return fmt.Errorf("file %s: %w", e.GetPath(), err)
		}
	}
	for _, e := range pl.links {
		if err := a.link(e); err != nil {
			return fmt.Errorf("symbolic link %s: %w", e.GetPath(), err)
		}
	}
	return a.prune(".", pl.wanted)
}

func split(p string) (string, string) { return path.Dir(p), path.Base(p) }

// setAttrs gives the open fd mode and owner; it reports whether it changed them.
func (a *treeApply) setAttrs(fd int, mode, uid, gid uint32) (bool, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, err
	}
	changed := false
	if st.Uid != uid || st.Gid != gid {
		if err := unix.Fchown(fd, int(uid), int(gid)); err != nil {
			return false, err
		}
		changed = true
	}
	// After the chown: it clears setgid.
	if st.Mode&0o7777 != mode || changed {
		if err := unix.Fchmod(fd, mode); err != nil {
			return false, err
		}
		changed = changed || st.Mode&0o7777 != mode
	}
	return changed, nil
}

func (a *treeApply) dir(e *protocol.TreeEntry) error {
	parent, name := split(e.GetPath())
	pfd := a.dirs[parent]
	var st unix.Stat_t
	err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case errors.Is(err, unix.ENOENT):
	case err != nil:
		return err
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		if err := a.removeAt(pfd, name); err != nil {
			return err
		}
	}
	made := false
	if err := unix.Mkdirat(pfd, name, 0o700); err == nil {
		made = true
	} else if !errors.Is(err, unix.EEXIST) {
		return err
	}
	fd, err := beneath(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	a.dirs[e.GetPath()] = fd
	changed, err := a.setAttrs(fd, e.GetMode()&^unix.S_ISUID, e.GetUid(), e.GetGid())
	if made || changed {
		a.written++
	}
	return err
}

// same reports whether name in pfd is a regular file with e's content and attributes.
func same(pfd int, name string, e *protocol.TreeEntry) bool {
	fd, err := beneath(pfd, name, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return false
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != int64(len(e.GetData())) ||
		st.Mode&0o7777 != fileMode(e) || st.Uid != e.GetUid() || st.Gid != e.GetGid() {
		return false
	}
	b, err := io.ReadAll(io.LimitReader(f, int64(len(e.GetData()))+1))
	return err == nil && bytes.Equal(b, e.GetData())
}

// fileMode: permission bits only (no setuid/setgid from a volume).
func fileMode(e *protocol.TreeEntry) uint32 { return e.GetMode() & 0o1777 }

func tmpName() string { return fmt.Sprintf("%s%d", tmpPrefix, tmpSeq.Add(1)) }

func (a *treeApply) file(e *protocol.TreeEntry) error {
	parent, name := split(e.GetPath())
	pfd := a.dirs[parent]
	if same(pfd, name, e) {
		return nil
	}
	tmp := tmpName()
	fd, err := unix.Openat(pfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = f.Write(e.GetData())
	if err == nil {
		err = unix.Fchown(fd, int(e.GetUid()), int(e.GetGid()))
	}
	if err == nil {
		err = unix.Fchmod(fd, fileMode(e))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = a.renameOver(pfd, tmp, name)
	}
	if err != nil {
		_ = unix.Unlinkat(pfd, tmp, 0)
		return err
	}
	a.written++
	return nil
}

func (a *treeApply) link(e *protocol.TreeEntry) error {
	parent, name := split(e.GetPath())
	pfd := a.dirs[parent]
	if cur, err := readlinkat(pfd, name); err == nil && cur == e.GetTarget() {
		return nil
	}
	tmp := tmpName()
	if err := unix.Symlinkat(e.GetTarget(), pfd, tmp); err != nil {
		return err
	}
	err := unix.Fchownat(pfd, tmp, int(e.GetUid()), int(e.GetGid()), unix.AT_SYMLINK_NOFOLLOW)
	if err == nil {
		err = a.renameOver(pfd, tmp, name)
	}
	if err != nil {
		_ = unix.Unlinkat(pfd, tmp, 0)
		return err
	}
	a.written++
	return nil
}

func readlinkat(dir int, name string) (string, error) {
	buf := make([]byte, maxLinkLen+1)
	n, err := unix.Readlinkat(dir, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// renameOver renames tmp to name in dir: atomic, unless name is a directory
// (which a file or link cannot replace: it is removed first).
func (a *treeApply) renameOver(dir int, tmp, name string) error {
	err := unix.Renameat(dir, tmp, dir, name)
	if errors.Is(err, unix.EISDIR) || errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
		if err := a.removeAt(dir, name); err != nil {
			return err
		}
		err = unix.Renameat(dir, tmp, dir, name)
	}
	return err
}

// prune removes what is in directory rel but not wanted, recursing into
// wanted directories; leftovers of an interrupted sync go too.
func (a *treeApply) prune(rel string, wanted map[string]protocol.TreeEntry_Kind) error {
	names, err := readDirNames(a.dirs[rel])
	if err != nil {
		return err
	}
	for _, n := range names {
		p := n
		if rel != "." {
			p = rel + "/" + n
		}
		k, ok := wanted[p]
		switch {
		case !ok:
			if err := a.removeAt(a.dirs[rel], n); err != nil {
				return fmt.Errorf("remove %s: %w", p, err)
			}
		case k == protocol.TreeEntry_DIR:
			if err := a.prune(p, wanted); err != nil {
				return err
			}
		}
	}
	return nil
}

func readDirNames(dir int) ([]string, error) {
	fd, err := unix.Openat(dir, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), ".")
	defer f.Close()
	return f.Readdirnames(-1)
}

// removeAt removes name in dir, a directory with everything in it.
func (a *treeApply) removeAt(dir int, name string) error {
	err := unix.Unlinkat(dir, name, 0)
	if err == nil {
		a.removed++
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	fd, err := beneath(dir, name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	names, err := readDirNames(fd)
	for _, n := range names {
		if err == nil {
			err = a.removeAt(fd, n)
		}
	}
	unix.Close(fd)
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(dir, name, unix.AT_REMOVEDIR); err != nil {
		return err
	}
	a.removed++
	return nil
}

// PrepareVolume implements protocol.AgentService (see agent.proto).
func (s *Service) PrepareVolume(ctx context.Context, req *protocol.PrepareVolumeRequest) (*protocol.Empty, error) {
	if err := validVolumeDir(req.GetPath(), s.cfg.RunRoot); err != nil {
		return nil, errInvalid("prepare volume: %v", err)
	}
	mode := req.GetMode()
	if mode == 0 {
		mode = 0o777
	}
	if mode > 0o7777 {
		return nil, errInvalid("prepare volume %s: mode %o out of range", req.GetPath(), mode)
	}
	s.treeMu.Lock()
	defer s.treeMu.Unlock()
	root, err := openRootDir(s.cfg.RunRoot)
	if err != nil {
		return nil, toStatus(err, "prepare volume %s", req.GetPath())
	}
	defer unix.Close(root)
	fd, err := mkdirBeneath(root, strings.TrimPrefix(req.GetPath(), s.cfg.RunRoot+"/"), mode)
	if err != nil {
		return nil, toStatus(err, "prepare volume: make %s", req.GetPath())
	}
	defer unix.Close(fd)
	if tag := req.GetVirtiofsTag(); tag != "" {
		return &protocol.Empty{}, mountShare(fd, tag, req)
	}
	if req.GetTmpfs() {
		mounted, err := isMountRoot(fd)
		if err != nil {
			return nil, toStatus(err, "prepare volume %s", req.GetPath())
		}
		if !mounted {
			opts := fmt.Sprintf("mode=%o", mode)
			if n := req.GetTmpfsSizeBytes(); n > 0 {
				opts += fmt.Sprintf(",size=%d", n)
			}
			// Through the fd: the path was resolved without links once.
			if err := unix.Mount("tmpfs", fmt.Sprintf("/proc/self/fd/%d", fd), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
				return nil, toStatus(err, "prepare volume: mount a tmpfs (%s) at %s", opts, req.GetPath())
			}
		}
		return &protocol.Empty{}, nil
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return nil, toStatus(err, "prepare volume %s", req.GetPath())
	}
	return &protocol.Empty{}, nil
}

// mountShare mounts the virtio-fs share tag at the directory fd (the
// shim's host directories: hostPath, PVCs, ctr --mount), once.
func mountShare(fd int, tag string, req *protocol.PrepareVolumeRequest) error {
	if req.GetTmpfs() || len(tag) > 36 {
		return errInvalid("prepare volume %s: a virtio-fs tag of 1..36 bytes and no tmpfs", req.GetPath())
	}
	mounted, err := isMountRoot(fd)
	if err != nil {
		return toStatus(err, "prepare volume %s", req.GetPath())
	}
	if mounted {
		return nil
	}
	// Through the fd: the path was resolved without links once.
	if err := unix.Mount(tag, fmt.Sprintf("/proc/self/fd/%d", fd), "virtiofs", unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return toStatus(err, "prepare volume: mount virtio-fs share %q at %s", tag, req.GetPath())
	}
	return nil
}

// isMountRoot reports whether the directory fd is the root of a mount.
func isMountRoot(fd int) (bool, error) {
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_BASIC_STATS, &stx); err != nil {
		return false, err
	}
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, nil
	}
	var here, up unix.Stat_t
	if err := unix.Fstat(fd, &here); err != nil {
		return false, err
	}
	if err := unix.Fstatat(fd, "..", &up, 0); err != nil {
		return false, err
	}
	return here.Dev != up.Dev, nil
}
