package agent

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
	"unsafe"

	"github.com/cube-runtime/cube/guest-agent/container"
	"github.com/cube-runtime/cube/guest-agent/protocol"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// ioctls from linux/fs.h (not in x/sys/unix).
const (
	ioctlFIFREEZE = 0xC0045877 // _IOWR('X', 119, int)
	ioctlFITHAW   = 0xC0045878 // _IOWR('X', 120, int)
)

func validSerial(s string) error {
	if s == "" || len(s) > 64 {
		return fmt.Errorf("disk serial %q must be 1..64 bytes", s)
	}
	for _, c := range []byte(s) {
		if c <= ' ' || c > '~' || c == '/' {
			return fmt.Errorf("disk serial %q contains %q", s, c)
		}
	}
	return nil
}

func (s *Service) MountDisk(ctx context.Context, req *protocol.MountDiskRequest) (*protocol.MountDiskResponse, error) {
	if err := validSerial(req.Serial); err != nil {
		return nil, errInvalid("%v", err)
	}
	mp := req.MountPoint
	if mp == "" {
		mp = filepath.Join(s.cfg.DiskRoot, req.Serial)
	}
	if !filepath.IsAbs(mp) || filepath.Clean(mp) != mp {
		return nil, errInvalid("mount point %q is not a clean absolute path", mp)
	}
	fstype := req.FsType
	if fstype == "" {
		fstype = "ext4"
	}
	tf := time.Now()
	dev, err := s.findDisk(req.Serial)
	if err != nil {
		return nil, err
	}
	// The settle step must not run on a mounted device (it drops cached
	// blocks), nor hold the lock while it waits.
	if err := s.diskFree(mp, dev); err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := s.settleDisk(ctx, dev, fstype); err != nil {
		return nil, toStatus(err, "disk %q", req.Serial)
	}
	t1 := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.diskFreeLocked(mp, dev); err != nil {
		return nil, err
	}
	flags, _, data := container.ParseMountOptions(req.Options)
	if req.ReadOnly {
		flags |= unix.MS_RDONLY
	}
	if err := os.MkdirAll(mp, 0o755); err != nil {
		return nil, toStatus(err, "create mount point %s", mp)
	}
	if err := unix.Mount(dev, mp, fstype, flags, data); err != nil {
		return nil, toStatus(err, "mount disk %q (%s) as %s on %s", req.Serial, dev, fstype, mp)
	}
	s.disks[mp] = dev
	t2 := time.Now()
	s.setReadahead(dev)
	timing := fmt.Sprintf("find=%.1f settle=%.1f mount=%.1f readahead=%.1f", ms(t0.Sub(tf)), ms(t1.Sub(t0)), ms(t2.Sub(t1)), ms(time.Since(t2)))
	// Debug: the shim logs the mount with this timing (console bytes are VM exits).
	s.log.WithFields(logrus.Fields{"serial": req.Serial, "device": dev, "mount": mp, "ms": timing}).Debug("disk mounted")
	return &protocol.MountDiskResponse{MountPoint: mp, Device: dev, Timing: timing}, nil
}

// diskFree checks that nothing is mounted at mp by the agent and that dev
// is not mounted by it elsewhere.
func (s *Service) diskFree(mp, dev string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.diskFreeLocked(mp, dev)
}

func (s *Service) diskFreeLocked(mp, dev string) error {
	if d, ok := s.disks[mp]; ok {
		return errState("%s already has disk %s mounted", mp, d)
	}
	for m, d := range s.disks {
		if d == dev {
			return errState("disk %s is already mounted on %s", dev, m)
		}
	}
	return nil
}

func (s *Service) UnmountDisk(ctx context.Context, req *protocol.UnmountDiskRequest) (*protocol.Empty, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.disks[req.MountPoint]; !ok {
		return nil, errNotFound("no disk mounted by the agent at %q", req.MountPoint)
	}
	if s.frozen[req.MountPoint] {
		return nil, errState("%s is frozen; thaw it first", req.MountPoint)
	}
	if err := unix.Unmount(req.MountPoint, 0); err != nil {
		return nil, toStatus(err, "unmount %s", req.MountPoint)
	}
	delete(s.disks, req.MountPoint)
	return &protocol.Empty{}, nil
}

func (s *Service) SyncFilesystems(ctx context.Context, _ *protocol.Empty) (*protocol.Empty, error) {
	unix.Sync()
	return &protocol.Empty{}, nil
}

func (s *Service) FreezeFilesystems(ctx context.Context, req *protocol.FreezeRequest) (*protocol.FreezeResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	mps := req.MountPoints
	if len(mps) == 0 {
		for mp := range s.disks {
			mps = append(mps, mp)
		}
		sort.Strings(mps)
	}
	unix.Sync()
	var done []string
	for _, mp := range mps {
		if s.frozen[mp] {
			continue
		}
		if err := fsIoctl(mp, ioctlFIFREEZE); err != nil {
			// All or nothing: a half-frozen guest gives an inconsistent snapshot.
			for _, d := range done {
				fsIoctl(d, ioctlFITHAW)
				delete(s.frozen, d)
			}
			return nil, toStatus(err, "freeze %s", mp)
		}
		s.frozen[mp] = true
		done = append(done, mp)
	}
	return &protocol.FreezeResponse{Frozen: done}, nil
}

func (s *Service) ThawFilesystems(ctx context.Context, req *protocol.ThawRequest) (*protocol.Empty, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	mps := req.MountPoints
	if len(mps) == 0 {
		for mp := range s.frozen {
			mps = append(mps, mp)
		}
	}
	var errs []error
	for _, mp := range mps {
		err := fsIoctl(mp, ioctlFITHAW)
		// EINVAL: not frozen (e.g. thawed by someone else): the goal is met.
		if err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("thaw %s: %w", mp, err))
			continue
		}
		delete(s.frozen, mp)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, toStatus(err, "thaw")
	}
	return &protocol.Empty{}, nil
}

func fsIoctl(mp string, req uint) error {
	fd, err := unix.Open(mp, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// validTime checks SetTime's (and Freshen's) time.
func validTime(unixNano int64) error {
	if unixNano <= 0 {
		return errInvalid("time %d is not after the epoch", unixNano)
	}
	return nil
}

// validEntropy checks ReseedRandom's (and Freshen's) host entropy.
func validEntropy(b []byte) error {
	if n := len(b); n < 16 || n > 4096 {
		return errInvalid("entropy is %d bytes, want 16..4096", n)
	}
	return nil
}

func (s *Service) SetTime(ctx context.Context, req *protocol.SetTimeRequest) (*protocol.Empty, error) {
	if err := validTime(req.UnixNano); err != nil {
		return nil, err
	}
	if err := s.cfg.SetClock(time.Unix(0, req.UnixNano)); err != nil {
		return nil, toStatus(err, "set clock")
	}
	return &protocol.Empty{}, nil
}

func (s *Service) ReseedRandom(ctx context.Context, req *protocol.ReseedRandomRequest) (*protocol.Empty, error) {
	if err := validEntropy(req.Entropy); err != nil {
		return nil, err
	}
	if err := addEntropy(s.cfg.RandomDevice, req.Entropy, true); err != nil {
		return nil, toStatus(err, "reseed RNG")
	}
	s.reseeds.Add(1)
	return &protocol.Empty{}, nil
}

// Freshen is SetTime, ReseedRandom and, when asked, MountDisk in one call:
// the first call of a guest restored from a snapshot (see the protocol).
// Ordering: both fields are checked before the clock moves, so a bad
// request changes nothing; the clock is stepped before the mount, so the
// file system records the real mount time.
func (s *Service) Freshen(ctx context.Context, req *protocol.FreshenRequest) (*protocol.FreshenResponse, error) {
	if err := validTime(req.UnixNano); err != nil {
		return nil, err
	}
	if err := validEntropy(req.Entropy); err != nil {
		return nil, err
	}
	if _, err := s.SetTime(ctx, &protocol.SetTimeRequest{UnixNano: req.UnixNano}); err != nil {
		return nil, err
	}
	if _, err := s.ReseedRandom(ctx, &protocol.ReseedRandomRequest{Entropy: req.Entropy}); err != nil {
		return nil, err
	}
	if req.Mount == nil {
		return &protocol.FreshenResponse{}, nil
	}
	m, err := s.MountDisk(ctx, req.Mount)
	if err != nil {
		return nil, err
	}
	return &protocol.FreshenResponse{Mount: m}, nil
}

// addEntropy mixes data into the input pool (credited when credit) with
// RNDADDENTROPY, then forces the CRNG to reseed from it (RNDRESEEDCRNG):
// without the reseed, the CRNG keeps producing its pre-snapshot stream
// until its next scheduled reseed.
func addEntropy(dev string, data []byte, credit bool) error {
	fd, err := unix.Open(dev, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dev, err)
	}
	defer unix.Close(fd)
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	buf := make([]byte, 8+len(data)+3)
	bits := 0
	if credit {
		bits = len(data) * 8
	}
	binary.NativeEndian.PutUint32(buf[0:], uint32(bits))
	binary.NativeEndian.PutUint32(buf[4:], uint32(len(data)))
	copy(buf[8:], data)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
		return fmt.Errorf("RNDADDENTROPY: %w", e)
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.RNDRESEEDCRNG, 0); e != 0 {
		return fmt.Errorf("RNDRESEEDCRNG: %w", e)
	}
	return nil
}

// NoteTransportReset is called when a vsock connection was reset: after a VM
// restore every connection is. Bursts (all connections at once) count once.
// The guest reseeds its RNG right away from virtio-rng so a clone does not
// wait for the host's ReseedRandom to diverge from its siblings.
func (s *Service) NoteTransportReset() {
	now := time.Now().UnixNano()
	if last := s.lastReset.Swap(now); now-last < int64(time.Second) {
		return
	}
	n := s.resets.Add(1)
	s.log.WithField("resets", n).Warn("vsock transport reset (VM restored?): processes keep running, waiting for new connections")
	if !s.reseeding.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer s.reseeding.Store(false)
		seed := make([]byte, 64)
		// Fresh timing makes clones differ even without a hardware RNG.
		binary.NativeEndian.PutUint64(seed, uint64(time.Now().UnixNano()))
		credit := false
		if f, err := os.Open(s.cfg.HWRNG); err == nil {
			// The read goes into its own buffer: after a timeout it may
			// still complete, and must not race with the reseed below.
			hw := make([]byte, len(seed)-8)
			done := make(chan bool, 1)
			go func() {
				_, err := io.ReadFull(f, hw)
				done <- err == nil
			}()
			select {
			case credit = <-done:
				if credit {
					copy(seed[8:], hw)
				}
			case <-time.After(2 * time.Second):
				s.log.Warn("hwrng read timed out; reseeding from timing only")
			}
			f.Close()
		}
		if err := addEntropy(s.cfg.RandomDevice, seed, credit); err != nil {
			s.log.WithError(err).Warn("reseed after transport reset")
			return
		}
		s.reseeds.Add(1)
	}()
}

func (s *Service) PowerOff(ctx context.Context, _ *protocol.PowerOffRequest) (*protocol.Empty, error) {
	if s.cfg.PowerOff == nil {
		return nil, toStatus(errUnavailable("power off is only available when the agent is the guest's init"), "power off")
	}
	s.log.Info("powering off")
	// Reply first; the machine disappears under the connection otherwise.
	go func() {
		time.Sleep(50 * time.Millisecond)
		if err := s.cfg.PowerOff(); err != nil {
			s.log.WithError(err).Error("power off failed")
		}
	}()
	return &protocol.Empty{}, nil
}

// ---- files ----

const maxPath = 4096

// openRoot returns a directory fd that paths are resolved in: the
// container's root (through /proc/<pid>/root) or the guest's /.
func (s *Service) openRoot(containerID string) (int, error) {
	root := "/"
	if containerID != "" {
		_, p, err := s.lookup(containerID, "")
		if err != nil {
			return -1, err
		}
		if st, _ := p.status(); st == stateStopped {
			return -1, errState("container %q has exited; its root is gone", containerID)
		}
		root = fmt.Sprintf("/proc/%d/root", p.pid)
	}
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, toStatus(err, "open root of %q", containerID)
	}
	return fd, nil
}

func validFilePath(p string) error {
	if p == "" || len(p) > maxPath || strings.ContainsRune(p, 0) || !strings.HasPrefix(p, "/") {
		return fmt.Errorf("path %q must be absolute, without NUL, at most %d bytes", p, maxPath)
	}
	return nil
}

// openIn opens p inside root; RESOLVE_IN_ROOT treats root as "/" for every
// symlink and "..", so a container's symlinks cannot reach the guest.
func openIn(root int, p string, flags uint64, mode uint32) (int, error) {
	return unix.Openat2(root, p, &unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC,
		Mode:    uint64(mode),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
}

func (s *Service) ReadFile(ctx context.Context, req *protocol.ReadFileRequest) (*protocol.ReadFileResponse, error) {
	if err := validFilePath(req.Path); err != nil {
		return nil, errInvalid("%v", err)
	}
	if req.Offset < 0 {
		return nil, errInvalid("offset %d is negative", req.Offset)
	}
	n := int(req.Length)
	if n == 0 || n > protocol.MaxFileChunk {
		n = protocol.MaxFileChunk
	}
	root, err := s.openRoot(req.ContainerId)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	fd, err := openIn(root, req.Path, unix.O_RDONLY, 0)
	if err != nil {
		return nil, toStatus(err, "read %s", req.Path)
	}
	f := os.NewFile(uintptr(fd), req.Path)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, toStatus(err, "read %s", req.Path)
	}
	if st.IsDir() {
		return nil, errInvalid("read %s: is a directory", req.Path)
	}
	buf := make([]byte, n)
	got, err := f.ReadAt(buf, req.Offset)
	eof := errors.Is(err, io.EOF)
	if err != nil && !eof {
		return nil, toStatus(err, "read %s", req.Path)
	}
	if !eof && req.Offset+int64(got) >= st.Size() && st.Mode().IsRegular() {
		eof = true
	}
	return &protocol.ReadFileResponse{Data: buf[:got], Eof: eof, Size: st.Size(), Mode: uint32(st.Mode().Perm())}, nil
}

func (s *Service) WriteFile(ctx context.Context, req *protocol.WriteFileRequest) (*protocol.WriteFileResponse, error) {
	if err := validFilePath(req.Path); err != nil {
		return nil, errInvalid("%v", err)
	}
	if len(req.Data) > protocol.MaxFileChunk {
		return nil, errInvalid("write %s: %d bytes, more than %d per request (use append)", req.Path, len(req.Data), protocol.MaxFileChunk)
	}
	if req.Mode > 0o7777 {
		return nil, errInvalid("mode %o out of range", req.Mode)
	}
	mode := req.Mode
	if mode == 0 {
		mode = 0o644
	}
	root, err := s.openRoot(req.ContainerId)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	if req.MakeParents {
		if err := mkdirAllIn(root, filepath.Dir(req.Path)); err != nil {
			return nil, toStatus(err, "create parents of %s", req.Path)
		}
	}
	flags := uint64(unix.O_WRONLY | unix.O_CREAT)
	if req.Append {
		flags |= unix.O_APPEND
	} else {
		flags |= unix.O_TRUNC
	}
	fd, err := openIn(root, req.Path, flags, mode)
	if err != nil {
		return nil, toStatus(err, "write %s", req.Path)
	}
	f := os.NewFile(uintptr(fd), req.Path)
	defer f.Close()
	if req.Uid != 0 || req.Gid != 0 {
		if err := f.Chown(int(req.Uid), int(req.Gid)); err != nil {
			return nil, toStatus(err, "chown %s", req.Path)
		}
	}
	if _, err := f.Write(req.Data); err != nil {
		return nil, toStatus(err, "write %s", req.Path)
	}
	st, err := f.Stat()
	if err != nil {
		return nil, toStatus(err, "write %s", req.Path)
	}
	return &protocol.WriteFileResponse{Size: st.Size()}, nil
}

func mkdirAllIn(root int, dir string) error {
	cur := ""
	for _, c := range strings.Split(dir, "/") {
		if c == "" {
			continue
		}
		cur += "/" + c
		fd, err := openIn(root, cur, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err == nil {
			unix.Close(fd)
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return err
		}
		parent, err := openIn(root, filepath.Dir(cur), unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		err = unix.Mkdirat(parent, c, 0o755)
		unix.Close(parent)
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	return nil
}
