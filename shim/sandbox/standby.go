package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/shim/standby"
)

// Adopter is a VMM that can take over a standby VM instead of starting one
// (ProcessVMM). A sandbox whose VMM is none cannot use standbys.
type Adopter interface {
	// Adopt makes the standby's cube-vmm this VMM, as Start would have
	// made a new one: cfg is what the sandbox would have started it with
	// (sockets and console in the standby's directory). On error nothing
	// changed, and Start may still be called.
	Adopt(ctx context.Context, cfg VMConfig, sb standby.Standby) error
	// VMMBinary is the cube-vmm a standby is started with.
	VMMBinary() string
}

// standbyFits says whether this sandbox's VM could be a standby of its
// template: restored from a template (not a checkpoint), with no network
// (a standby has no taps) and no host directories bound in the template's
// share (a standby's share is empty; an automatic template's is).
func (s *Sandbox) standbyFits() bool {
	if !s.o.Standby || s.o.Template == "" || s.restore != nil || s.o.Network != nil {
		return false
	}
	if _, ok := s.o.VMM.(Adopter); !ok {
		return false
	}
	recs, err := ReadShares(s.o.Template)
	return err == nil && len(recs) == 0
}

// claimStandby adopts a standby of the sandbox's template, if one is free:
// the sandbox's state dir becomes the standby's. nil when there is none.
func (s *Sandbox) claimStandby() *standby.Standby {
	if !s.standbyFits() {
		return nil
	}
	sb, ok, err := standby.Claim(filepath.Dir(s.o.Dir), s.o.Template)
	if err != nil {
		s.o.Log.WithError(err).Warn("no standby VM: looking for one failed")
		return nil
	}
	if !ok {
		return nil
	}
	if sb.Record.Slots != s.o.DiskSlots {
		s.dropStandby(&sb, fmt.Errorf("it has %d drive slots, the sandbox %d", sb.Record.Slots, s.o.DiskSlots))
		return nil
	}
	return &sb
}

// dropStandby ends a claimed standby that could not be adopted.
func (s *Sandbox) dropStandby(sb *standby.Standby, why error) {
	s.o.Log.WithError(why).WithField("standby", sb.Dir).Warn("standby VM not adopted; restoring from the template instead")
	if err := standby.Kill(sb.Record.Pid, sb.Record.StartTime); err != nil {
		s.o.Log.WithError(err).WithField("standby", sb.Dir).Warn("stop the standby VM")
	}
	_ = os.RemoveAll(sb.Dir)
}

// makeStandby leaves a standby VM of the sandbox's template for the next
// sandbox, unless one is free already or another shim is making one. It
// returns once cube-vmm runs (the restore goes on at idle priority).
func (s *Sandbox) makeStandby() {
	if !s.standbyFits() {
		return
	}
	log := s.o.Log.WithField("template", s.o.Template)
	stateDir := filepath.Dir(s.o.Dir)
	lock, err := os.OpenFile(filepath.Join(stateDir, standby.LockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		log.WithError(err).Warn("no standby VM made")
		return
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		log.Debug("no standby VM made: another shim is making one")
		return
	}
	free, err := standby.List(stateDir)
	if err != nil {
		log.WithError(err).Warn("no standby VM made")
		return
	}
	for _, f := range free {
		if f.Record.Template == s.o.Template {
			log.WithField("standby", f.Dir).Debug("no standby VM made: one is free")
			return
		}
	}
	start := time.Now()
	dir, pid, err := s.spawnStandby(stateDir)
	if err != nil {
		log.WithError(err).Warn("no standby VM made")
		return
	}
	log.WithFields(logrus.Fields{"standby": dir, "pid": pid, "took": time.Since(start).Round(time.Microsecond)}).Info("standby VM started for the next sandbox")
}

// spawnStandby starts cube-vmm restoring the template into a new standby
// directory and publishes its record. On error nothing is left.
func (s *Sandbox) spawnStandby(stateDir string) (dir string, pid int, err error) {
	// Ordering: before anything is made for a standby that cannot start.
	bin, err := exec.LookPath(s.o.VMM.(Adopter).VMMBinary())
	if err != nil {
		return "", 0, fmt.Errorf("find vmm binary: %w", err)
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	dir = filepath.Join(stateDir, standby.DirPrefix+hex.EncodeToString(id[:]))
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", 0, err
	}
	var cmd *exec.Cmd
	defer func() {
		if err != nil {
			if cmd != nil && cmd.Process != nil {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
			_ = os.RemoveAll(dir)
		}
	}()
	// The files a sandbox's state dir has (prepareVM, prepareShare): the
	// adopting sandbox's state dir becomes this one.
	cfg := stateFiles(dir)
	cfg.Template, cfg.DiskUses = s.o.Template, map[string]string{}
	for i := 0; i < s.o.DiskSlots; i++ {
		stub := stubPath(dir, i)
		if err := writeStub(stub); err != nil {
			return "", 0, err
		}
		cfg.DiskUses[SlotSerial(i)] = stub
	}
	if share, err := snapshotHasShare(s.o.Template); err != nil {
		return "", 0, err
	} else if share {
		if err := os.Mkdir(shareDirIn(dir), 0o700); err != nil {
			return "", 0, err
		}
		cfg.Shares = []Share{{Tag: ShareTag, Path: shareDirIn(dir)}}
	}
	out, err := os.OpenFile(filepath.Join(dir, standby.LogName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return "", 0, err
	}
	defer out.Close() // the child has its own
	cmd = exec.Command(bin, Args(cfg)...)
	// Own process group, as every VMM; output to a file, which outlives
	// this shim (a pipe to it would break when the shim exits).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stdout, cmd.Stderr = out, out
	idle, err := standby.StartIdle(cmd)
	if err != nil {
		return "", 0, fmt.Errorf("start %s: %w", bin, err)
	}
	if !idle {
		s.o.Log.Debug("standby VM runs at normal priority: SCHED_IDLE refused")
	}
	st, err := standby.StartTime(cmd.Process.Pid)
	if err != nil {
		return "", 0, fmt.Errorf("standby vmm pid %d: %w", cmd.Process.Pid, err)
	}
	if err := standby.Write(dir, standby.Record{Template: s.o.Template, Pid: cmd.Process.Pid, StartTime: st,
		Slots: s.o.DiskSlots, Made: time.Now()}); err != nil {
		return "", 0, err
	}
	// Reaped here while this shim lives; after, by init.
	go func() { _ = cmd.Wait() }()
	return dir, cmd.Process.Pid, nil
}

// adoptStandby makes sb this sandbox's VM: the state dir becomes the
// standby's and the VMM adopts its cube-vmm; slot 0 is then pointed at
// firstImage (the restore would have done it while the VM was parked).
// false, with the standby ended, when it cannot be adopted.
func (s *Sandbox) adoptStandby(ctx context.Context, sb *standby.Standby, cfg VMConfig, firstImage string) (bool, error) {
	if err := s.o.VMM.(Adopter).Adopt(ctx, cfg, *sb); err != nil {
		s.dropStandby(sb, err)
		return false, nil
	}
	if firstImage != "" {
		// Ordering: before the agent is asked to mount it (MountDisk waits
		// for the media change the guest sees).
		if err := s.o.VMM.SetDisk(ctx, SlotSerial(0), firstImage, false); err != nil {
			return true, fmt.Errorf("point slot 0 of the adopted standby at the rootfs: %w", err)
		}
	}
	return true, nil
}
