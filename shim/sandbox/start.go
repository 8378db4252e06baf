package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/shim/standby"
)

// Start boots the VM with firstImage (the first container's rootfs) in slot 0
// and waits for the agent. On error everything started is torn down. Its
// log line "sandbox started" times each step (steps_ms).
func (s *Sandbox) Start(ctx context.Context, firstImage, firstOwner string) (retErr error) {
	s.mu.Lock()
	if s.state != StateNew {
		st := s.state
		s.mu.Unlock()
		return fmt.Errorf("sandbox %s: start in state %s", s.o.ID, st)
	}
	s.state = StateBooting
	s.mu.Unlock()
	steps := NewSteps(time.Now())
	// Ordering: before the boot timeout starts: waiting for or making a
	// template has its own bounds (template_wait, the build's timeout).
	s.chooseTemplate(ctx)
	steps.Mark("template")
	ctx, cancel := context.WithTimeout(ctx, s.o.BootTimeout)
	defer cancel()

	// A standby's directory becomes the sandbox's state dir (its sockets,
	// stubs and console are there).
	ownDir := s.o.Dir
	sb := s.claimStandby()
	if sb != nil {
		s.o.Dir = sb.Dir
	}
	if err := os.MkdirAll(s.o.Dir, 0o700); err != nil {
		return fmt.Errorf("sandbox %s: state dir: %w", s.o.ID, err)
	}
	defer func() {
		if retErr != nil {
			// Ordering: before teardown removes the state dir and the console log with it.
			s.logConsoleTail("the sandbox failed to start")
			s.teardown(false)
		}
	}()
	netAtt, adopted, err := s.startVMM(ctx, sb, ownDir, firstImage, firstOwner, steps)
	closeTaps(netAtt)
	if err != nil {
		return err
	}
	go s.supervise()
	// A VM restored from a snapshot had its agent listening when it was
	// taken: the vsock handshake (the guest accepting on the agent's port)
	// is enough, and the first calls of readyGuest show the agent answers.
	// Health would cost a round trip to the guest before them.
	agent, err := s.dialAgent(ctx, s.o.Template == "")
	if err != nil {
		return fmt.Errorf("sandbox %s: %w (console log: %s)", s.o.ID, err, stateFiles(s.o.Dir).ConsolePath)
	}
	steps.Mark("agent")
	if err := s.readyGuest(ctx, agent, netAtt, steps); err != nil {
		agent.Close()
		return fmt.Errorf("sandbox %s: %w", s.o.ID, err)
	}
	s.mu.Lock()
	s.agent = agent
	if s.state == StateBooting {
		s.state = StateRunning
	}
	s.mu.Unlock()
	s.o.Log.WithFields(logrus.Fields{"sandbox": s.o.ID, "template": s.o.Template, "standby": adopted, "total_ms": MS(steps.Total()),
		"steps_ms": steps.String()}).Info("sandbox started")
	// The next sandbox of this template finds a VM ready. Ordering: after
	// this one started, and at idle priority, so it takes nothing from it;
	// Stop waits for it (standbyMade).
	made := make(chan struct{})
	s.mu.Lock()
	s.standbyMade = made
	s.mu.Unlock()
	go func() {
		defer close(made)
		s.makeStandby()
	}()
	return nil
}

// startVMM prepares the VM and starts its VMM, or adopts the claimed
// standby sb; a standby that cannot be adopted is ended and the sandbox
// starts its own VMM in ownDir instead.
func (s *Sandbox) startVMM(ctx context.Context, sb *standby.Standby, ownDir, firstImage, firstOwner string, steps *Steps) (*NetworkAttachment, bool, error) {
	cfg, netAtt, err := s.prepareVM(ctx, firstImage, firstOwner, sb != nil)
	if err != nil {
		return netAtt, false, err
	}
	steps.Mark("prepare")
	if sb != nil {
		adopted, err := s.adoptStandby(ctx, sb, cfg, firstImage)
		if err != nil {
			return netAtt, true, fmt.Errorf("sandbox %s: %w", s.o.ID, err)
		}
		if adopted {
			s.o.Log.WithFields(logrus.Fields{"sandbox": s.o.ID, "standby": sb.Dir, "pid": sb.Record.Pid,
				"standby_age": time.Since(sb.Record.Made).Round(time.Millisecond)}).Info("adopted a standby VM")
			steps.Mark("vmm")
			return netAtt, true, nil
		}
		s.o.Dir, s.slots = ownDir, nil
		if err := os.MkdirAll(s.o.Dir, 0o700); err != nil {
			return netAtt, false, fmt.Errorf("sandbox %s: state dir: %w", s.o.ID, err)
		}
		if cfg, netAtt, err = s.prepareVM(ctx, firstImage, firstOwner, false); err != nil {
			return netAtt, false, err
		}
	}
	if err := s.o.VMM.Start(ctx, cfg); err != nil {
		return netAtt, false, fmt.Errorf("sandbox %s: start vmm: %w", s.o.ID, err)
	}
	steps.Mark("vmm")
	return netAtt, false, nil
}

// prepareVM makes what the VMM starts with (stub disks, the share, the
// network) and returns its configuration and the network attached.
// For a standby being adopted (adopting) the stubs exist already: its VMM
// has them open, and slot 0 is set afterwards (adoptStandby).
func (s *Sandbox) prepareVM(ctx context.Context, firstImage, firstOwner string, adopting bool) (VMConfig, *NetworkAttachment, error) {
	var disks []Disk
	// A template was snapshotted with stub drives in every slot: restored,
	// each slot is backed by the sandbox's own stub as it is (no copy of
	// the template's), and the first rootfs is put in slot 0 before the
	// guest runs (docs/shim.md, "Templates").
	template := s.o.Template != "" && s.restore == nil
	uses, sets := map[string]string{}, map[string]string{}
	for i := 0; i < s.o.DiskSlots; i++ {
		sl := slot{serial: SlotSerial(i), stub: stubPath(s.o.Dir, i)}
		if !adopting {
			if err := writeStub(sl.stub); err != nil {
				return VMConfig{}, nil, fmt.Errorf("sandbox %s: %w", s.o.ID, err)
			}
		}
		path := sl.stub
		if template {
			uses[sl.serial] = sl.stub
		}
		if i == 0 && firstImage != "" && s.restore == nil {
			path, sl.owner = firstImage, firstOwner
			if template {
				sets[sl.serial] = firstImage
			}
		}
		if r := s.restore; r != nil && sl.serial == r.RootfsSerial {
			path, sl.owner = r.RootfsImage, r.Owner
		}
		s.slots = append(s.slots, sl)
		disks = append(disks, Disk{Serial: sl.serial, Path: path})
	}
	cfg := stateFiles(s.o.Dir)
	cfg.Kernel, cfg.Initrd, cfg.Cmdline = s.o.Kernel, s.o.Initrd, s.o.Cmdline
	cfg.MemoryMiB, cfg.VCPUs, cfg.HugeTLB, cfg.Disks = s.o.MemoryMiB, s.o.VCPUs, s.o.HugeTLB, disks
	cfg.GuestCID, cfg.Template = 3, s.o.Template
	if r := s.restore; r != nil {
		cfg.DiskPaths = map[string]string{r.RootfsSerial: r.RootfsImage}
	}
	if template && !adopting {
		cfg.DiskUses, cfg.DiskSets = uses, sets
	}
	if err := s.prepareShareFor(&cfg); err != nil {
		return cfg, nil, err
	}
	// Ordering: the network is attached before the VMM starts (it inherits
	// the taps) and configured in the guest before Start returns, so before
	// the first container exists.
	netAtt, err := s.attachNetwork(ctx)
	if err != nil {
		return cfg, nil, err
	}
	if netAtt != nil {
		cfg.Nets = netAtt.NICs
	}
	if cfg.ReplaceNets, err = s.snapshotNICs(netAtt); err != nil {
		closeTaps(netAtt)
		return cfg, nil, fmt.Errorf("sandbox %s: %w", s.o.ID, err)
	}
	return cfg, netAtt, nil
}

// prepareShareFor makes the virtio-fs share's directory and, for a
// restore, binds the snapshot's share entries; cfg gets the share.
func (s *Sandbox) prepareShareFor(cfg *VMConfig) error {
	// Ordering: the share's directory exists before the VMM opens it.
	share, err := s.prepareShare()
	if err != nil {
		return err
	}
	if share {
		cfg.Shares = []Share{{Tag: ShareTag, Path: s.shareDir()}}
	}
	s.mu.Lock()
	s.share = share
	s.mu.Unlock()
	if share && s.o.Template != "" {
		// Ordering: the snapshot's share entries are bound before cube-vmm
		// restores and re-opens the guest's FUSE session below them.
		var binds []ShareRecord
		if s.restore != nil {
			binds = s.restore.Shares
		}
		if err := s.bindRestoredShares(s.o.Template, binds); err != nil {
			return err
		}
	}
	return nil
}

// readyGuest does what the guest needs before its first container: after
// a restore its filesystems thawed, after any snapshot restore its clock
// and RNG freshened, and its network configured.
func (s *Sandbox) readyGuest(ctx context.Context, agent AgentClient, netAtt *NetworkAttachment, steps *Steps) error {
	if s.restore != nil {
		// Ordering: thawed before anything else asks the guest to write.
		if err := agent.ThawFilesystems(ctx); err != nil {
			return fmt.Errorf("after restoring %s: thaw guest filesystems: %w", s.o.Template, err)
		}
		steps.Mark("thaw")
	}
	if s.o.Template != "" {
		if err := s.freshenAndMount(ctx, agent); err != nil {
			return fmt.Errorf("after restoring template %s: %w", s.o.Template, err)
		}
		steps.Mark("freshen")
	}
	if err := configureGuestNetwork(ctx, agent, netAtt); err != nil {
		return err
	}
	if netAtt != nil {
		steps.Mark("network")
	}
	return nil
}

// stateFiles is a VMConfig with the VMM's sockets and the guest console
// at their places in the sandbox state dir dir.
func stateFiles(dir string) VMConfig {
	return VMConfig{
		VsockPath:   filepath.Join(dir, "vsock.sock"),
		ControlPath: filepath.Join(dir, "control.sock"),
		ConsolePath: filepath.Join(dir, "console.log"),
	}
}

// stubPath is the stub of drive slot i in the sandbox state dir dir.
func stubPath(dir string, i int) string { return filepath.Join(dir, fmt.Sprintf("slot-%d.img", i)) }

func writeStub(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("stub disk: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(stubSize); err != nil {
		return fmt.Errorf("stub disk %s: %w", path, err)
	}
	return nil
}

// dialAgent retries until the guest accepts the connection and, with
// health, the agent answers Health: a booting guest's vsock listener
// appears late.
func (s *Sandbox) dialAgent(ctx context.Context, health bool) (AgentClient, error) {
	var last error
	for n, delay := 1, 2*time.Millisecond; ; n, delay = n+1, min(delay*2, 100*time.Millisecond) {
		a, err := s.o.Dial(ctx, s.o.VMM)
		if err == nil {
			if health {
				err = a.Health(ctx)
			}
			if err == nil {
				s.o.Log.WithFields(logrus.Fields{"sandbox": s.o.ID, "attempts": n}).Debug("agent answered")
				return a, nil
			}
			a.Close()
		}
		if n == 1 {
			s.o.Log.WithError(err).WithField("sandbox", s.o.ID).Debug("agent not answering yet")
		}
		last = err
		select {
		case <-s.o.VMM.Wait():
			return nil, fmt.Errorf("vmm exited while waiting for the agent: %s", s.o.VMM.Exit().describe())
		case <-ctx.Done():
			return nil, fmt.Errorf("agent did not answer before the boot timeout: %w (last error: %v)", ctx.Err(), last)
		case <-time.After(delay):
		}
	}
}
