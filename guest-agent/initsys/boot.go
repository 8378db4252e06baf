package initsys

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cube-runtime/cube/guest-agent/netif"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// switchedEnv marks the re-executed /init running on the tmpfs root.
const switchedEnv = "CUBE_INIT_TMPFS_ROOT=1"

const newRoot = "/.cube-root"

// OnTmpfsRoot reports whether this /init was re-executed on the tmpfs root.
func OnTmpfsRoot() bool {
	for _, e := range os.Environ() {
		if e == switchedEnv {
			return true
		}
	}
	return false
}

// SwitchRootNeeded reports whether / is still the initramfs (rootfs), on
// which pivot_root(2) fails with EINVAL, so containers could not pivot.
func SwitchRootNeeded() (bool, error) {
	if OnTmpfsRoot() {
		return false, nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs("/", &st); err != nil {
		return false, fmt.Errorf("statfs /: %w", err)
	}
	return st.Type == unix.RAMFS_MAGIC || st.Type == unix.TMPFS_MAGIC, nil
}

// SwitchToTmpfsRoot moves the initramfs content into a fresh tmpfs, makes
// that the root (MS_MOVE onto / and chroot, as switch_root does) and
// re-executes /init there. It returns only on error. Must run as PID 1 before
// any other mount: mounts below / would otherwise be left behind.
func SwitchToTmpfsRoot() error {
	if err := os.MkdirAll(newRoot, 0o755); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	if err := unix.Mount("tmpfs", newRoot, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("switch root: mount tmpfs: %w", err)
	}
	// Move rather than copy: deleting each file after copying keeps peak
	// memory at one file, not two images.
	if err := moveTree("/", newRoot); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	if err := unix.Chdir(newRoot); err != nil {
		return fmt.Errorf("switch root: chdir: %w", err)
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("switch root: move tmpfs onto /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("switch root: chroot: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("switch root: chdir /: %w", err)
	}
	env := append(os.Environ(), switchedEnv)
	if err := unix.Exec("/init", os.Args, env); err != nil {
		return fmt.Errorf("switch root: exec /init: %w", err)
	}
	return nil
}

// moveTree copies every file of src's filesystem into dst and removes it
// from src. Other filesystems mounted below src and dst itself are skipped.
func moveTree(src, dst string) error {
	var rootDev uint64
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return err
	}
	rootDev = st.Dev
	var dirs []string
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dst {
			return filepath.SkipDir
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if st.Dev != rootDev {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		mode := fs.FileMode(st.Mode & 0o7777)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if rel != "." {
				if err := os.Mkdir(target, mode); err != nil && !errors.Is(err, fs.ErrExist) {
					return err
				}
				dirs = append(dirs, p)
			}
		case unix.S_IFLNK:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(l, target); err != nil {
				return err
			}
			os.Remove(p)
		case unix.S_IFREG:
			if err := copyFile(p, target, mode); err != nil {
				return err
			}
			os.Remove(p)
		default: // device nodes, fifos, sockets
			if err := unix.Mknod(target, st.Mode, int(st.Rdev)); err != nil {
				return fmt.Errorf("mknod %s: %w", target, err)
			}
			os.Remove(p)
		}
		if err := unix.Lchown(target, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			return os.Chmod(target, mode)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		os.Remove(dirs[i]) // fails for mount points and non-empty dirs: fine
	}
	return nil
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return out.Close()
}

type mount struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
}

// baseMounts are mounted in this order: /dev/pts and /dev/shm need /dev,
// the cgroup2 mount needs /sys.
var baseMounts = []mount{
	{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
	{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "mode=0620,gid=5,ptmxmode=0666"},
	{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
	{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
	{"cgroup2", "/sys/fs/cgroup", "cgroup2", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
}

// MountBase mounts /proc, /sys, /dev (devtmpfs), /dev/pts, /dev/shm, /run and
// cgroup2. Already-mounted targets (EBUSY) are fine.
func MountBase() error {
	for _, m := range baseMounts {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			return fmt.Errorf("mount %s: %w", m.target, err)
		}
		err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data)
		if err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.target, err)
		}
	}
	if _, err := os.Lstat("/dev/ptmx"); errors.Is(err, fs.ErrNotExist) {
		os.Symlink("pts/ptmx", "/dev/ptmx")
	}
	return nil
}

// ConsoleStdio points fds 0, 1 and 2 at /dev/console when init was started
// without them: an initramfs without a dev/console node leaves /init with no
// stdio (which the Go runtime then fills with /dev/null). Real stdio (the
// kernel's console, a test's pipe) is kept.
func ConsoleStdio() error {
	var st unix.Stat_t
	if err := unix.Fstat(2, &st); err == nil && !isDevNull(&st) {
		return nil
	}
	f, err := os.OpenFile("/dev/console", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return fmt.Errorf("open console: %w", err)
	}
	defer f.Close()
	for fd := 0; fd <= 2; fd++ {
		if err := unix.Dup3(int(f.Fd()), fd, 0); err != nil {
			return fmt.Errorf("dup console to fd %d: %w", fd, err)
		}
	}
	return nil
}

// PowerOff flushes filesystems and powers the machine off. It returns only
// on failure (e.g. without CAP_SYS_BOOT).
func PowerOff() error {
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		return fmt.Errorf("reboot(POWER_OFF): %w", err)
	}
	return nil
}

// Boot brings the guest up as PID 1: tmpfs root (re-executing /init), base
// mounts, console stdio, kernel modules. Failures are returned for logging;
// the agent keeps going with what works, because an agent that exits takes
// the VM down (the kernel panics when init exits).
func Boot() (loaded []string, err error) {
	need, err := SwitchRootNeeded()
	if err != nil {
		return nil, err
	}
	if need {
		// Needs /dev/console for nothing and no other mount yet.
		if err := SwitchToTmpfsRoot(); err != nil {
			return nil, err
		}
	}
	var errs []error
	if err := MountBase(); err != nil {
		errs = append(errs, err)
	}
	if err := ConsoleStdio(); err != nil {
		errs = append(errs, err)
	}
	l, err := NewModuleLoader()
	if err == nil {
		loaded, err = l.Load(Modules)
	}
	if err != nil {
		errs = append(errs, err)
	}
	return loaded, errors.Join(errs...)
}

func isDevNull(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && unix.Major(st.Rdev) == 1 && unix.Minor(st.Rdev) == 3
}

// LoopbackUp brings lo up in the guest's initial network namespace, the one
// every container without a network namespace of its own shares: the kernel
// creates it down and, with the agent as /init, nothing else would bring it
// up. It logs the outcome; an error means lo is not up.
func LoopbackUp(log logrus.FieldLogger) error {
	wasUp, err := netif.LoopbackUp()
	if err != nil {
		return fmt.Errorf("boot: loopback: %w", err)
	}
	if wasUp {
		log.WithField("interface", netif.Loopback).Info("loopback already up")
	} else {
		log.WithField("interface", netif.Loopback).Info("loopback up")
	}
	return nil
}
