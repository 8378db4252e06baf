package volume

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/guest-agent/protocol"
	"github.com/cube-runtime/cube/shim/sandbox"
)

// Reading a host volume's tree: the kubelet writes it, but the shim reads
// it as root, so it is treated as hostile. Below the volume's root no link
// is followed (openat with O_NOFOLLOW; each directory by its fd), only
// directories, regular files and links are accepted, links must stay inside
// the tree, and entries, depth and bytes are bounded by what one SyncTree
// carries. A tree the kubelet is swapping while it is read is read again.

// Limits bound a tree read from the host.
type Limits struct {
	Entries, Bytes, Depth int
}

// DefaultLimits are what one SyncTree request carries.
var DefaultLimits = Limits{Entries: protocol.MaxTreeEntries, Bytes: protocol.MaxTreeBytes, Depth: 16}

// readAttempts bounds re-reads of a tree that changed while being read.
const readAttempts = 5

// errChanged: an entry vanished or "..data" moved during the walk.
var errChanged = errors.New("the tree changed while it was read")

// ReadTree reads the tree at root (root itself may be reached through links:
// the kubelet's root dir often is one).
func ReadTree(root string, lim Limits) (sandbox.Tree, error) {
	var t sandbox.Tree
	err := retryChanged(root, func() error {
		var err error
		t, err = walkTree(root, lim, true)
		return err
	})
	return t, err
}

// Fingerprint summarises the tree at root without reading file contents:
// names, kinds, modes, owners, sizes, times, inodes and link targets. A
// tree whose fingerprint did not change need not be read again.
func Fingerprint(root string, lim Limits) (string, error) {
	var sum string
	err := retryChanged(root, func() error {
		t, err := walkTree(root, lim, false)
		if err != nil {
			return err
		}
		h := sha256.New()
		fmt.Fprintf(h, "%o %d %d\n", t.Mode, t.UID, t.GID)
		for _, e := range t.Entries {
			fmt.Fprintf(h, "%q %d %o %d %d %s %q\n", e.Path, e.Kind, e.Mode, e.UID, e.GID, e.Data, e.Target)
		}
		sum = hex.EncodeToString(h.Sum(nil))
		return nil
	})
	return sum, err
}

// retryChanged runs read until it sees a tree that held still: no entry
// vanished and the kubelet's "..data" pointed at the same place before and
// after.
func retryChanged(root string, read func() error) error {
	var err error
	for range readAttempts {
		before, _ := os.Readlink(path.Join(root, "..data"))
		err = read()
		after, _ := os.Readlink(path.Join(root, "..data"))
		if err == nil && before != after {
			err = errChanged
		}
		if !errors.Is(err, errChanged) {
			return err
		}
	}
	return fmt.Errorf("%s: %w %d times in a row", root, err, readAttempts)
}

type walker struct {
	lim      Limits
	withData bool
	t        sandbox.Tree
	bytes    int
}

func walkTree(root string, lim Limits, withData bool) (sandbox.Tree, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return sandbox.Tree{}, fmt.Errorf("open %s: %w", root, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return sandbox.Tree{}, err
	}
	w := &walker{lim: lim, withData: withData}
	w.t.Mode, w.t.UID, w.t.GID = st.Mode&0o7777, st.Uid, st.Gid
	if err := w.dir(fd, "", 1); err != nil {
		return sandbox.Tree{}, fmt.Errorf("%s: %w", root, err)
	}
	return w.t, nil
}

func invalid(format string, a ...any) error {
	return fmt.Errorf(format+": %w", append(a, errdefs.ErrInvalidArgument)...)
}

// vanished maps an entry that went away mid-walk to errChanged.
func vanished(err error) error {
	if errors.Is(err, unix.ENOENT) {
		return errChanged
	}
	return err
}

func (w *walker) dir(fd int, rel string, depth int) error {
	if depth > w.lim.Depth {
		return invalid("%s: deeper than %d levels", rel, w.lim.Depth)
	}
	dup, err := unix.Dup(fd)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(dup), rel)
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return vanished(err)
	}
	sort.Strings(names)
	for _, n := range names {
		p := n
		if rel != "" {
			p = rel + "/" + n
		}
		if len(w.t.Entries) >= w.lim.Entries {
			return invalid("more than %d entries", w.lim.Entries)
		}
		if err := w.entry(fd, n, p, depth); err != nil {
			return err
		}
	}
	return nil
}

func (w *walker) entry(dir int, name, p string, depth int) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return vanished(err)
	}
	e := sandbox.TreeEntry{Path: p, Mode: st.Mode & 0o7777, UID: st.Uid, GID: st.Gid}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		e.Kind = sandbox.TreeDir
		w.t.Entries = append(w.t.Entries, e)
		fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return vanished(err)
		}
		defer unix.Close(fd)
		return w.dir(fd, p, depth+1)
	case unix.S_IFLNK:
		e.Kind = sandbox.TreeSymlink
		buf := make([]byte, unix.PathMax+1)
		n, err := unix.Readlinkat(dir, name, buf)
		if err != nil {
			return vanished(err)
		}
		e.Target = string(buf[:n])
		if err := linkStaysInside(p, e.Target); err != nil {
			return err
		}
	case unix.S_IFREG:
		e.Kind = sandbox.TreeFile
		if w.bytes += int(st.Size); w.bytes > w.lim.Bytes {
			return invalid("more than %d bytes of files", w.lim.Bytes)
		}
		if w.withData {
			data, err := readRegular(dir, name, st, w.lim.Bytes)
			if err != nil {
				return err
			}
			e.Data = data
		} else {
			// The fingerprint: what a rewrite changes, without reading.
			e.Data = fmt.Appendf(nil, "%d %d.%d %d.%d %d", st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec, st.Ino)
		}
	default:
		return invalid("%s: a %s; only directories, regular files and symbolic links are copied into the VM", p, typeName(st.Mode))
	}
	w.t.Entries = append(w.t.Entries, e)
	return nil
}

// readRegular reads the regular file name in dir, the one lstat saw.
func readRegular(dir int, name string, st unix.Stat_t, max int) ([]byte, error) {
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, vanished(err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var now unix.Stat_t
	if err := unix.Fstat(fd, &now); err != nil {
		return nil, err
	}
	if now.Ino != st.Ino || now.Dev != st.Dev || now.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, errChanged
	}
	data, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err != nil {
		return nil, err
	}
	if len(data) > max {
		return nil, invalid("%s: more than %d bytes", name, max)
	}
	return data, nil
}

// linkStaysInside refuses a link target that is absolute or climbs above
// the tree's root (the kubelet's links never do; the agent refuses them too).
func linkStaysInside(p, target string) error {
	if target == "" || strings.ContainsRune(target, 0) {
		return invalid("symbolic link %s: empty target", p)
	}
	if strings.HasPrefix(target, "/") {
		return invalid("symbolic link %s: absolute target %q leaves the volume", p, target)
	}
	if r := path.Join(path.Dir(p), target); r == ".." || strings.HasPrefix(r, "../") {
		return invalid("symbolic link %s: target %q leaves the volume", p, target)
	}
	return nil
}

func typeName(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	}
	return fmt.Sprintf("file of type %#o", mode&unix.S_IFMT)
}
