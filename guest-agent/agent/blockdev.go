package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cube-runtime/cube/guest-agent/protocol"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A raw block volume (Kubernetes volumeDevices) reaches the guest as the
// medium of a drive slot, swapped in at run time (cube-vmm disk-set). The
// container's spec names the host's device numbers, which mean nothing
// here: BlockDevice tells the host the guest's numbers of the slot's
// /dev/vdX, and the host rewrites the spec's device entry with them, so the
// node createDevice makes at the container's path is the slot's device.
// Before answering it waits until the driver has the new medium's capacity
// (a config-change interrupt, handled asynchronously: see disksettle.go)
// and drops the device's cached pages, which may be the stub's.

// sectorSize is the unit of /sys/block/<dev>/size.
const sectorSize = 512

// BlockDevice implements the BlockDevice RPC.
func (s *Service) BlockDevice(ctx context.Context, req *protocol.BlockDeviceRequest) (*protocol.BlockDeviceResponse, error) {
	if err := validSerial(req.Serial); err != nil {
		return nil, errInvalid("%v", err)
	}
	dev, err := s.findDisk(req.Serial)
	if err != nil {
		return nil, err
	}
	if mp := s.mountOf(dev); mp != "" {
		return nil, errState("disk %q (%s) is mounted at %s: a container's rootfs, not a raw block volume", req.Serial, dev, mp)
	}
	sys := filepath.Join(s.cfg.SysBlock, filepath.Base(dev))
	major, minor, err := sysDevNumbers(filepath.Join(sys, "dev"))
	if err != nil {
		return nil, toStatus(err, "disk %q", req.Serial)
	}
	// Ordering: the capacity first (the medium has changed by then), then
	// the flush: no page of the stub survives into the container's reads.
	size, err := s.waitCapacity(ctx, sys, req.SizeBytes)
	if st, ok := status.FromError(err); ok && err != nil {
		return nil, status.Errorf(st.Code(), "disk %q: %s", req.Serial, st.Message())
	} else if err != nil {
		return nil, toStatus(err, "disk %q (%s)", req.Serial, dev)
	}
	if err := flushBlockCache(dev); err != nil {
		return nil, toStatus(err, "disk %q", req.Serial)
	}
	s.log.WithFields(logrus.Fields{"serial": req.Serial, "device": dev, "major": major, "minor": minor, "bytes": size}).Info("raw block volume ready")
	return &protocol.BlockDeviceResponse{Device: dev, Major: major, Minor: minor, SizeBytes: size}, nil
}

// mountOf returns where the agent mounted dev ("" when it did not).
func (s *Service) mountOf(dev string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for mp, d := range s.disks {
		if d == dev {
			return mp
		}
	}
	return ""
}

// sysDevNumbers parses a sysfs "dev" file ("253:16").
func sysDevNumbers(file string) (major, minor uint32, err error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, 0, err
	}
	maj, min, ok := strings.Cut(strings.TrimSpace(string(b)), ":")
	ma, err1 := strconv.ParseUint(maj, 10, 32)
	mi, err2 := strconv.ParseUint(min, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return 0, 0, status.Errorf(codes.Internal, "%s holds %q, not major:minor", file, b)
	}
	return uint32(ma), uint32(mi), nil
}

// sysSize reads a sysfs block device's capacity in bytes.
func sysSize(sys string) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(sys, "size"))
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s/size: %w", sys, err)
	}
	return n * sectorSize, nil
}

// waitCapacity waits (DiskSettleTimeout) until the device at sysfs dir sys
// is want bytes large, and returns its size; want 0 does not wait.
func (s *Service) waitCapacity(ctx context.Context, sys string, want uint64) (uint64, error) {
	timeout := s.cfg.DiskSettleTimeout
	if timeout <= 0 {
		timeout = defaultDiskSettle
	}
	t0 := time.Now()
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		size, err := sysSize(sys)
		if err != nil {
			return 0, err
		}
		if want == 0 || size == want {
			if waited := time.Since(t0); waited > 5*time.Millisecond {
				s.log.WithField("device", filepath.Base(sys)).WithField("waited", waited).Debug("disk capacity settled")
			}
			return size, nil
		}
		if time.Since(t0) > timeout {
			return 0, status.Errorf(codes.DeadlineExceeded, "%s is %d bytes, its medium %d: the new capacity did not reach the guest within %v", filepath.Base(sys), size, want, timeout)
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("waiting for the capacity (%d bytes, want %d): %w", size, want, ctx.Err())
		case <-time.After(delay):
		}
	}
}

// flushBlockCache drops dev's cached pages (BLKFLSBUF).
func flushBlockCache(dev string) error {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dev, err)
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, unix.BLKFLSBUF, 0); err != nil {
		return fmt.Errorf("drop cached blocks of %s (BLKFLSBUF): %w", dev, err)
	}
	return nil
}
