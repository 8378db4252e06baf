package container

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// setupRootfs runs in the helper, inside the container's fresh mount
// namespace. Order binds: propagation before any mount (so nothing leaks to
// the agent's namespace), spec mounts before devices (a /dev tmpfs would
// hide them), pivot_root before sysctls and masked/readonly paths (those
// paths are container paths).
func setupRootfs(rootfs string, spec *specs.Spec, stg *stages) error {
	if rootfs == "" {
		return invalidf("no rootfs")
	}
	st, err := os.Stat(rootfs)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: rootfs %q does not exist", ErrNotFound, rootfs)
		}
		return fmt.Errorf("stat rootfs: %w", err)
	}
	if !st.IsDir() {
		return invalidf("rootfs %q is not a directory", rootfs)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make / rslave: %w", err)
	}
	// pivot_root needs the new root to be a mount point.
	if err := unix.Mount(rootfs, rootfs, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind rootfs %s: %w", rootfs, err)
	}
	hasDevTmpfs := false
	for i, m := range spec.Mounts {
		if err := mountOne(rootfs, m); err != nil {
			return fmt.Errorf("spec.mounts[%d] %s: %w", i, m.Destination, err)
		}
		if filepath.Clean(m.Destination) == "/dev" && m.Type == "tmpfs" {
			hasDevTmpfs = true
		}
	}
	stg.mark("mounts")
	if hasDevTmpfs {
		if err := populateDev(rootfs); err != nil {
			return err
		}
	}
	for _, d := range spec.Linux.Devices {
		if err := createDevice(rootfs, d); err != nil {
			return err
		}
	}
	stg.mark("dev")
	if err := pivotRoot(rootfs); err != nil {
		return err
	}
	stg.mark("pivot")
	if p := spec.Linux.RootfsPropagation; p != "" {
		if err := unix.Mount("", "/", "", propagationFlags[p], ""); err != nil {
			return fmt.Errorf("set rootfs propagation %s: %w", p, err)
		}
	}
	// Ordering: sysctls before the masked and read-only paths, as runc
	// does: /proc/sys is among CRI's read-only paths, and a pod with a
	// network of its own gets net.* sysctls (ip_unprivileged_port_start).
	for k, v := range spec.Linux.Sysctl {
		p := "/proc/sys/" + strings.ReplaceAll(k, ".", "/")
		if err := os.WriteFile(p, []byte(v), 0); err != nil {
			return fmt.Errorf("sysctl %s=%s: %w", k, v, err)
		}
	}
	stg.mark("sysctl")
	for _, p := range spec.Linux.MaskedPaths {
		if err := maskPath(p); err != nil {
			return err
		}
	}
	stg.mark("masked")
	for _, p := range spec.Linux.ReadonlyPaths {
		if err := readonlyPath(p); err != nil {
			return err
		}
	}
	stg.mark("readonly")
	if spec.Root != nil && spec.Root.Readonly {
		if err := unix.Mount("", "/", "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("remount rootfs read-only: %w", err)
		}
	}
	return nil
}

// rootSwitch records for the status report how pivotRoot switched roots.
var rootSwitch string

// pivotRoot makes rootfs the root. pivot_root(".", ".") stacks the old root
// under the new one, which we then detach (runc's technique, no temporary
// directory needed). When / is the initramfs, pivot_root fails with EINVAL
// (rootfs cannot be unmounted); then move the mount over / and chroot.
func pivotRoot(rootfs string) error {
	rootSwitch = "pivot_root"
	oldRoot, err := unix.Open("/", unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open old root: %w", err)
	}
	defer unix.Close(oldRoot)
	if err := unix.Chdir(rootfs); err != nil {
		return fmt.Errorf("chdir rootfs: %w", err)
	}
	err = unix.PivotRoot(".", ".")
	if errors.Is(err, unix.EINVAL) {
		if err := unix.Mount(rootfs, "/", "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("pivot_root: EINVAL, and move rootfs onto /: %w", err)
		}
		if err := unix.Chroot("."); err != nil {
			return fmt.Errorf("chroot rootfs: %w", err)
		}
		rootSwitch = "move+chroot"
		return unix.Chdir("/")
	}
	if err != nil {
		return fmt.Errorf("pivot_root %s: %w", rootfs, err)
	}
	if err := unix.Fchdir(oldRoot); err != nil {
		return fmt.Errorf("fchdir old root: %w", err)
	}
	// Keep the unmount from propagating to the agent's namespace.
	if err := unix.Mount("", ".", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make old root rslave: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	return unix.Chdir("/")
}

var mountFlags = map[string]struct {
	clear bool
	flag  uintptr
}{
	"ro": {false, unix.MS_RDONLY}, "rw": {true, unix.MS_RDONLY},
	"nosuid": {false, unix.MS_NOSUID}, "suid": {true, unix.MS_NOSUID},
	"nodev": {false, unix.MS_NODEV}, "dev": {true, unix.MS_NODEV},
	"noexec": {false, unix.MS_NOEXEC}, "exec": {true, unix.MS_NOEXEC},
	"sync": {false, unix.MS_SYNCHRONOUS}, "async": {true, unix.MS_SYNCHRONOUS},
	"dirsync": {false, unix.MS_DIRSYNC}, "remount": {false, unix.MS_REMOUNT},
	"mand": {false, unix.MS_MANDLOCK}, "nomand": {true, unix.MS_MANDLOCK},
	"noatime": {false, unix.MS_NOATIME}, "atime": {true, unix.MS_NOATIME},
	"nodiratime": {false, unix.MS_NODIRATIME}, "diratime": {true, unix.MS_NODIRATIME},
	"relatime": {false, unix.MS_RELATIME}, "norelatime": {true, unix.MS_RELATIME},
	"strictatime": {false, unix.MS_STRICTATIME}, "nostrictatime": {true, unix.MS_STRICTATIME},
	"bind": {false, unix.MS_BIND}, "rbind": {false, unix.MS_BIND | unix.MS_REC},
}

var propagationFlags = map[string]uintptr{
	"private": unix.MS_PRIVATE, "rprivate": unix.MS_PRIVATE | unix.MS_REC,
	"shared": unix.MS_SHARED, "rshared": unix.MS_SHARED | unix.MS_REC,
	"slave": unix.MS_SLAVE, "rslave": unix.MS_SLAVE | unix.MS_REC,
	"unbindable": unix.MS_UNBINDABLE, "runbindable": unix.MS_UNBINDABLE | unix.MS_REC,
}

// parseMountOptions splits fstab options into flags, propagation flags and
// filesystem data.
func parseMountOptions(opts []string) (flags, prop uintptr, data string) {
	var d []string
	for _, o := range opts {
		if f, ok := mountFlags[o]; ok {
			if f.clear {
				flags &^= f.flag
			} else {
				flags |= f.flag
			}
		} else if p, ok := propagationFlags[o]; ok {
			prop |= p
		} else {
			d = append(d, o)
		}
	}
	return flags, prop, strings.Join(d, ",")
}

func mountOne(rootfs string, m specs.Mount) error {
	dest, err := securePath(rootfs, m.Destination)
	if err != nil {
		return err
	}
	flags, prop, data := parseMountOptions(m.Options)
	typ, src := m.Type, m.Source
	isBind := flags&unix.MS_BIND != 0
	if typ == "cgroup" || typ == "cgroup2" {
		// The guest has cgroup2 only. A fresh cgroup2 mount shows the
		// container's own cgroup as root (in its cgroup namespace); where
		// that is refused, show the agent's hierarchy read-only.
		keep := flags & (unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
		if err := mkTarget(dest, true); err != nil {
			return err
		}
		if err := unix.Mount("cgroup2", dest, "cgroup2", keep, ""); err == nil {
			return nil
		}
		typ, src, isBind = "", "/sys/fs/cgroup", true
		flags = unix.MS_BIND | unix.MS_REC | keep
	}
	if isBind {
		st, err := os.Stat(src)
		if err != nil {
			return fmt.Errorf("%w: bind source %q: %v", ErrNotFound, src, err)
		}
		if err := mkTarget(dest, st.IsDir()); err != nil {
			return err
		}
		if err := unix.Mount(src, dest, "", flags&(unix.MS_BIND|unix.MS_REC), ""); err != nil {
			return fmt.Errorf("bind %s: %w", src, err)
		}
		// Bind mounts ignore other flags until remounted.
		if rest := flags &^ (unix.MS_BIND | unix.MS_REC | unix.MS_REMOUNT); rest != 0 {
			if err := unix.Mount("", dest, "", unix.MS_BIND|unix.MS_REMOUNT|rest, ""); err != nil {
				return fmt.Errorf("remount bind %s: %w", src, err)
			}
		}
	} else {
		if err := mkTarget(dest, true); err != nil {
			return err
		}
		if src == "" {
			src = typ
		}
		if err := unix.Mount(src, dest, typ, flags, data); err != nil {
			return fmt.Errorf("mount %s (%s, %q): %w", typ, src, data, err)
		}
	}
	if prop != 0 {
		if err := unix.Mount("", dest, "", prop, ""); err != nil {
			return fmt.Errorf("set propagation: %w", err)
		}
	}
	return nil
}

func mkTarget(p string, dir bool) error {
	if dir {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return fmt.Errorf("create mount point: %w", err)
		}
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("create mount point: %w", err)
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDONLY, 0o644)
	if err != nil {
		return fmt.Errorf("create mount point: %w", err)
	}
	return f.Close()
}

// securePath resolves p inside root like a chroot would: symlinks in the
// rootfs (which the image controls) cannot point mounts outside it.
func securePath(root, p string) (string, error) {
	const maxLinks = 40
	links := 0
	var resolved string // relative to root, no leading slash
	rest := strings.Split(filepath.Clean("/"+p), "/")
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		if c == "" || c == "." {
			continue
		}
		if c == ".." {
			resolved = filepath.Dir("/" + resolved)[1:]
			continue
		}
		next := filepath.Join(resolved, c)
		st, err := os.Lstat(filepath.Join(root, next))
		if err != nil || st.Mode()&fs.ModeSymlink == 0 {
			// Missing components will be created as directories.
			resolved = next
			continue
		}
		if links++; links > maxLinks {
			return "", invalidf("too many symlinks resolving %q", p)
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(target) {
			resolved = ""
		}
		rest = append(strings.Split(target, "/"), rest...)
	}
	return filepath.Join(root, resolved), nil
}

// populateDev fills a fresh /dev tmpfs with the standard nodes, bound from
// the agent's devtmpfs (binding works where mknod might be refused).
func populateDev(rootfs string) error {
	for _, n := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		dst := filepath.Join(rootfs, "dev", n)
		if err := mkTarget(dst, false); err != nil {
			return err
		}
		if err := unix.Mount("/dev/"+n, dst, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind /dev/%s: %w", n, err)
		}
	}
	for name, target := range map[string]string{
		"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
		"stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx",
	} {
		p := filepath.Join(rootfs, "dev", name)
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		if err := os.Symlink(target, p); err != nil {
			return fmt.Errorf("create /dev/%s: %w", name, err)
		}
	}
	return nil
}

func createDevice(rootfs string, d specs.LinuxDevice) error {
	dst, err := securePath(rootfs, d.Path)
	if err != nil {
		return err
	}
	typ, err := deviceType(d.Type)
	if err != nil {
		return invalidf("device %s: %v", d.Path, err)
	}
	mode := uint32(0o666)
	if d.FileMode != nil {
		mode = uint32(d.FileMode.Perm())
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	os.Remove(dst)
	if err := unix.Mknod(dst, typ|mode, int(unix.Mkdev(uint32(d.Major), uint32(d.Minor)))); err != nil {
		if errors.Is(err, unix.EEXIST) {
			// One of populateDev's standard nodes (a bind mount: Remove cannot remove it), listed again in
			// the spec, as a privileged container's devices are (all of the node's). runc keeps an existing
			// node too; it is left as it is, owner included.
			return nil
		}
		return fmt.Errorf("mknod %s: %w", d.Path, err)
	}
	uid, gid := 0, 0
	if d.UID != nil {
		uid = int(*d.UID)
	}
	if d.GID != nil {
		gid = int(*d.GID)
	}
	return os.Lchown(dst, uid, gid)
}

func maskPath(p string) error {
	st, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("mask %s: %w", p, err)
	}
	if st.IsDir() {
		err = unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY, "size=0")
	} else {
		err = unix.Mount("/dev/null", p, "", unix.MS_BIND, "")
	}
	if err != nil {
		return fmt.Errorf("mask %s: %w", p, err)
	}
	return nil
}

func readonlyPath(p string) error {
	if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("readonly %s: %w", p, err)
	}
	if err := unix.Mount("", p, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("readonly %s: %w", p, err)
	}
	return nil
}

// ParseMountOptions splits fstab-style options into mount flags,
// propagation flags and filesystem data.
func ParseMountOptions(opts []string) (flags, propagation uintptr, data string) {
	return parseMountOptions(opts)
}
