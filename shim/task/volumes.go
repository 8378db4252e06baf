package task

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/volume"
)

// Host bind mounts of a container spec, decided by what the source is
// (shim/volume.Parse; docs/shim.md, "Volumes"):
//   - a directory bound at /dev/shm → a tmpfs of the container's own;
//   - a kubelet emptyDir → a directory in the VM shared by the pod's
//     containers: on the sandbox container's rootfs disk (so in every
//     snapshot and rollback), or a guest tmpfs of the host tmpfs's size when
//     the kubelet made it one (medium: Memory);
//   - a kubelet configMap, secret, projected or downwardAPI volume → a copy
//     of its tree in the guest, kept in sync (volume.Syncer);
//   - a termination log → a guest file, copied back to the host file when
//     the container's init exits (the kubelet reads it there);
//   - any other host regular file (CRI's hosts, hostname, resolv.conf, the
//     kubelet's etc-hosts) → a guest copy kept in sync, rewritten in place;
//   - any other host directory (hostPath, a PVC, another volume plugin,
//     ctr --mount type=bind) → shared with the VM through the sandbox's
//     virtio-fs share (sandbox.ShareHostDir), read-only on the host too;
//   - a subPath directory, a device, socket or fifo → refused, naming the
//     mount and why. InvalidArgument, not NotImplemented: containerd takes
//     Unimplemented from the task API v3 Create for a missing service and
//     retries with v2, losing the message.

// guestFilesDir holds host files copied into the guest for bind mounts.
const guestFilesDir = "/run/cube/files"

// emptyDirOnDisk (relative to the sandbox container's rootfs disk) holds emptyDir volumes;
// emptyDirInRAM memory-backed ones (and any without a sandbox disk).
const (
	emptyDirOnDisk = ".cube-volumes/empty-dir"
	emptyDirInRAM  = "/run/cube/volumes/empty-dir"
)

// maxTerminationLog bounds the termination message copied back to the host
// (the kubelet reads at most 4 KiB of it).
const maxTerminationLog = 64 << 10

// shmOptions mount the tmpfs standing in for a host /dev/shm (CRI's default
// shm size, 64 MiB).
var shmOptions = []string{"nosuid", "nodev", "noexec", "mode=1777", "size=65536k"}

// guestVolumes is the part of the agent guestSpec prepares volumes with.
type guestVolumes interface {
	PrepareVolume(ctx context.Context, req sandbox.VolumeRequest) error
	WriteFile(ctx context.Context, path string, data []byte, mode uint32) error
}

// volumeUse is what one container's mounts hold in the guest.
type volumeUse struct {
	// synced: guest paths of the Syncer's items, released at Delete.
	synced []string
	// termLogs: guest files copied back to the host when the init exits.
	termLogs []termLog
	// shared: guest paths of host directories in the virtio-fs share.
	shared []string
}

// hostShares shares host directories with the VM (sandbox.Sandbox).
type hostShares interface {
	ShareHostDir(ctx context.Context, r sandbox.ShareRequest) (string, error)
	UnshareHostDir(guest string) error
}

type termLog struct{ host, guest string }

func guestMount(ctx context.Context, m *specs.Mount, i int, env specEnv) error {
	if !isBind(m) {
		return nil
	}
	fi, err := os.Stat(m.Source)
	if err != nil {
		return fmt.Errorf("bind mount at %s: host source: %v: %w", m.Destination, err, errdefs.ErrInvalidArgument)
	}
	v := volume.Parse(m.Source)
	switch {
	case fi.IsDir() && path.Clean(m.Destination) == "/dev/shm":
		opts := slices.Clone(shmOptions)
		if slices.Contains(m.Options, "ro") {
			opts = append(opts, "ro")
		}
		*m = specs.Mount{Destination: m.Destination, Type: "tmpfs", Source: "shm", Options: opts}
		return nil
	case fi.IsDir() && v.Kind == volume.EmptyDir:
		return emptyDirMount(ctx, m, fi, v, env)
	case fi.IsDir() && v.Kind == volume.Copied:
		dst := v.GuestDir()
		if err := env.volumes.AddTree(ctx, m.Source, dst); err != nil {
			return fmt.Errorf("%s at %s: copy %s into the VM: %w", v.Describe(), m.Destination, m.Source, err)
		}
		env.use.synced = append(env.use.synced, dst)
		env.debug(m, dst, "volume copied into the VM, kept in sync")
		m.Source = dst
		return nil
	case fi.Mode().IsRegular():
		dst := path.Join(guestFilesDir, env.containerID, strconv.Itoa(i)+"-"+filepath.Base(m.Source))
		if v.Kind == volume.TerminationLog {
			// The container writes it, the kubelet reads it: not synced in.
			data, err := os.ReadFile(m.Source)
			if err == nil && len(data) > maxTerminationLog {
				data = data[:maxTerminationLog]
			}
			if err == nil {
				err = env.agent.WriteFile(ctx, dst, data, uint32(fi.Mode().Perm()))
			}
			if err != nil {
				return fmt.Errorf("termination log at %s: copy %s into the VM: %w", m.Destination, m.Source, err)
			}
			env.use.termLogs = append(env.use.termLogs, termLog{host: m.Source, guest: dst})
		} else {
			if err := env.volumes.AddFile(ctx, m.Source, dst); err != nil {
				return fmt.Errorf("bind mount of host file %s at %s: %w", m.Source, m.Destination, err)
			}
			env.use.synced = append(env.use.synced, dst)
		}
		env.debug(m, dst, "host file copied into the VM")
		m.Source = dst
		return nil
	case fi.IsDir() && v.Kind == volume.Unsupported && v.Plugin == "subPath":
		// The subPath's volume may live in the VM (emptyDir) or be a copy:
		// the host directory is not what the guest has.
		return fmt.Errorf("%s at %s (host %s): subPath directories are not served (the volume may live in the VM); mount the whole volume: %w",
			v.Describe(), m.Destination, m.Source, errdefs.ErrInvalidArgument)
	case fi.IsDir() && (v.Kind == volume.Unsupported || v.Kind == volume.Other):
		return sharedDirMount(ctx, m, v, env)
	case v.Kind != volume.Other:
		return fmt.Errorf("%s at %s (host %s): its source is a host %s, not a directory: only directories are shared with the VM: %w",
			v.Describe(), m.Destination, m.Source, kindOf(fi), errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("bind mount of host %s %s at %s: the VM cannot use host devices, sockets or fifos (virtio-fs shares directories and regular files only): %w",
		kindOf(fi), m.Source, m.Destination, errdefs.ErrInvalidArgument)
}

// kindOf names a file's type for an error.
func kindOf(fi os.FileInfo) string {
	switch t := fi.Mode().Type(); {
	case t&os.ModeDevice != 0 && t&os.ModeCharDevice != 0:
		return "character device"
	case t&os.ModeDevice != 0:
		return "block device"
	case t&os.ModeSocket != 0:
		return "socket"
	case t&os.ModeNamedPipe != 0:
		return "fifo"
	case t.IsRegular():
		return "regular file"
	}
	return "special file"
}

// sharedDirMount shares a host directory (hostPath, a PVC's mount, another
// volume plugin's directory, ctr --mount type=bind) with the VM through the
// sandbox's virtio-fs share, read-only on the host too when the mount is.
func sharedDirMount(ctx context.Context, m *specs.Mount, v volume.Path, env specEnv) error {
	ref := v.Describe()
	if ref == "" {
		ref = "host directory " + m.Source
	}
	ref += " at " + m.Destination
	if env.shares == nil {
		return fmt.Errorf("%s: no sandbox VM to share it with: %w", ref, errdefs.ErrFailedPrecondition)
	}
	ro := slices.Contains(m.Options, "ro")
	dst, err := env.shares.ShareHostDir(ctx, sandbox.ShareRequest{Source: m.Source, ReadOnly: ro, Ref: ref,
		Container: env.containerID, Destination: path.Clean(m.Destination)})
	if err != nil {
		return err
	}
	env.use.shared = append(env.use.shared, dst)
	env.debug(m, dst, "host directory shared with the VM (virtio-fs)")
	m.Source = dst
	return nil
}

func (env specEnv) debug(m *specs.Mount, dst, msg string) {
	if env.log != nil {
		env.log.WithFields(logrus.Fields{"host": m.Source, "guest": dst, "destination": m.Destination}).Debug(msg)
	}
}

// emptyDirMount points m at the emptyDir's directory in the VM, made (once
// per pod: the agent's PrepareVolume is idempotent) on the sandbox's disk,
// or as a tmpfs when the kubelet made the host directory one.
func emptyDirMount(ctx context.Context, m *specs.Mount, fi os.FileInfo, v volume.Path, env specEnv) error {
	mode := uint32(fi.Mode().Perm())
	if fi.Mode()&os.ModeSetgid != 0 {
		mode |= unix.S_ISGID
	}
	if fi.Mode()&os.ModeSticky != 0 {
		mode |= unix.S_ISVTX
	}
	req := sandbox.VolumeRequest{Mode: mode}
	var sfs unix.Statfs_t
	if err := unix.Statfs(m.Source, &sfs); err == nil && sfs.Type == unix.TMPFS_MAGIC {
		// medium: Memory. The kubelet sizes the tmpfs by sizeLimit (else
		// the node's allocatable memory): the guest's gets the same size.
		req.Path, req.Tmpfs, req.TmpfsSize = path.Join(emptyDirInRAM, v.Name), true, uint64(sfs.Blocks)*uint64(sfs.Bsize)
	} else if env.sandboxRoot != "" {
		req.Path = path.Join(env.sandboxRoot, emptyDirOnDisk, v.Name)
	} else {
		req.Path = path.Join(emptyDirInRAM, v.Name)
	}
	if err := env.agent.PrepareVolume(ctx, req); err != nil {
		return fmt.Errorf("%s at %s: make it in the VM: %w", v.Describe(), m.Destination, err)
	}
	env.debug(m, req.Path, "emptyDir lives in the VM")
	m.Source = req.Path
	return nil
}

// copyTerminationLogs copies c's termination logs from the guest back to
// the host files the kubelet reads, before the exit event goes out.
func (s *Service) copyTerminationLogs(ctx context.Context, c *container) {
	if c == nil || len(c.volumes.termLogs) == 0 {
		return
	}
	s.mu.Lock()
	sb := s.sb
	s.mu.Unlock()
	if sb == nil || sb.Agent() == nil {
		return
	}
	for _, tl := range c.volumes.termLogs {
		data, err := sb.Agent().ReadFile(ctx, tl.guest, maxTerminationLog)
		if err == nil {
			err = writeExisting(tl.host, data)
		}
		if err != nil {
			s.o.Log.WithError(err).WithFields(logrus.Fields{"container": c.id, "host": tl.host, "guest": tl.guest}).Warn("termination log not copied back to the host")
		}
	}
}

// writeExisting replaces the content of the existing host file p (the
// kubelet made it; not created, no link followed).
func writeExisting(p string, data []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
