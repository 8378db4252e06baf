package sandbox

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"
)

// TemplateVM is an automatic template TemplateFor found or made.
type TemplateVM struct {
	// Dir is its VM snapshot (what cube-vmm restore reads).
	Dir string
	// NICMACs are the MACs of its VM's virtio-net devices, in order (as
	// many as TemplateFor was asked for): backend-less NICs the restore
	// gives the sandbox's taps, and whose guest interfaces the agent moves
	// to the network's MACs (DeviceMAC), as after a fork.
	NICMACs []string
}

// NICCounter is a Network that says, before Attach, how many NICs its
// Attach gives: a sandbox with such a network is restored from a template
// with as many (backend-less) NICs. A Network without it cold-boots.
type NICCounter interface {
	NICCount() int
}

// TemplateNICMAC is the MAC of an automatic template's NIC i: locally
// administered and the same in every template. The guest's interface has it
// only until the agent moves it to the sandbox's MAC, before the interface
// comes up (nothing is ever sent with it).
func TemplateNICMAC(i int) string { return fmt.Sprintf("02:cb:00:00:00:%02x", i+1) }

// chooseTemplate sets o.Template from TemplateFor when a template can
// serve this sandbox, and logs why not when it cannot.
func (s *Sandbox) chooseTemplate(ctx context.Context) {
	if s.o.TemplateFor == nil || s.o.Template != "" || s.restore != nil {
		return
	}
	nics := 0
	if s.o.Network != nil {
		nc, ok := s.o.Network.(NICCounter)
		if !ok {
			s.o.Log.WithField("network", fmt.Sprintf("%T", s.o.Network)).Info("cold boot: the sandbox's network does not say how many NICs it gives, so no template shape fits it")
			return
		}
		if nics = nc.NICCount(); nics < 1 {
			s.o.Log.WithField("nics", nics).Info("cold boot: the sandbox has a network with no NIC")
			return
		}
	}
	start := time.Now()
	t, err := s.o.TemplateFor(ctx, nics)
	if err == nil && len(t.NICMACs) != nics {
		err = fmt.Errorf("template %s has %d NICs, the sandbox's network gives %d: %w", t.Dir, len(t.NICMACs), nics, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		s.o.Log.WithError(err).WithField("nics", nics).Warn("cold boot: no template")
		return
	}
	s.o.Log.WithFields(logrus.Fields{"template": t.Dir, "nics": nics, "took": time.Since(start).Round(time.Millisecond)}).Info("restoring from template")
	s.o.Template = t.Dir
	s.templateNICs = t.NICMACs
}

// snapshotNICs matches the network's NICs to the devices of the snapshot
// the VM is restored from (a checkpoint's, or the template's chooseTemplate
// picked), and says whether they replace its devices (cube-vmm restore
// -net fd=N for each). A cold boot has none to match.
func (s *Sandbox) snapshotNICs(a *NetworkAttachment) (replace bool, err error) {
	switch {
	case s.restore != nil:
		if err := restoreNICs(s.restore, a); err != nil {
			return false, err
		}
		return a != nil && len(a.NICs) > 0, nil
	case s.templateNICs != nil:
		if a == nil || len(a.NICs) != len(s.templateNICs) || len(a.Guest.Interfaces) != len(a.NICs) {
			n, g := 0, 0
			if a != nil {
				n, g = len(a.NICs), len(a.Guest.Interfaces)
			}
			return false, fmt.Errorf("template %s has %d NICs, the network attached %d NICs with %d guest interfaces (its NICCount said %d): %w",
				s.o.Template, len(s.templateNICs), n, g, len(s.templateNICs), errdefs.ErrInternal)
		}
		for i := range a.Guest.Interfaces {
			a.Guest.Interfaces[i].DeviceMAC = s.templateNICs[i]
		}
		return true, nil
	}
	return false, nil
}

// freshenRestoredGuest fixes what a restore leaves stale: the guest clock
// resumes at snapshot time, and every VM restored from one template would
// share the template's RNG state (freshen without a mount).
func freshenRestoredGuest(ctx context.Context, agent AgentClient, log *logrus.Entry) error {
	_, err := freshen(ctx, agent, log, nil, "")
	return err
}

// freshen steps the restored guest's clock, reseeds its RNG and, when mount
// is set, mounts that disk (the rootfs of container owner), in one Freshen
// call. An agent without it gets the separate calls, issued together
// (freshenSeparately; logged on log, if any).
func freshen(ctx context.Context, agent AgentClient, log *logrus.Entry, mount *MountDiskRequest, owner string) (MountedDisk, error) {
	entropy, err := hostEntropy()
	if err != nil {
		return MountedDisk{}, err
	}
	md, err := agent.Freshen(ctx, FreshenRequest{Time: time.Now(), Entropy: entropy, Mount: mount})
	switch {
	case errors.Is(err, errdefs.ErrNotImplemented):
		if log != nil {
			log.Info(LogOlderAgentFreshen)
		}
		return freshenSeparately(ctx, agent, entropy, mount, owner)
	case err != nil && mount != nil:
		return MountedDisk{}, fmt.Errorf("freshen the restored guest and mount the rootfs of %s: %w", owner, err)
	case err != nil:
		return MountedDisk{}, fmt.Errorf("freshen the restored guest: %w", err)
	}
	return md, nil
}

// LogOlderAgentFreshen is the shim's line when a restored guest's agent
// has no Freshen call and gets the separate calls instead.
const LogOlderAgentFreshen = "the guest agent predates Freshen: clock, RNG and rootfs mount are separate calls (an initrd of an older release; rebuild it with this release's cube-agent)"

// hostEntropy is 64 bytes for the guest's RNG.
func hostEntropy() ([]byte, error) {
	entropy := make([]byte, 64)
	if _, err := rand.Read(entropy); err != nil {
		return nil, fmt.Errorf("host entropy: %w", err)
	}
	return entropy, nil
}

// setTimeAndReseed is Freshen's work as the two calls of an older agent.
// They do not depend on each other: they are issued together.
func setTimeAndReseed(ctx context.Context, agent AgentClient, entropy []byte) error {
	reseeded := make(chan error, 1)
	go func() { reseeded <- agent.ReseedRandom(ctx, entropy) }()
	timeErr := agent.SetTime(ctx, time.Now())
	rngErr := <-reseeded
	if timeErr != nil {
		return fmt.Errorf("set guest time: %w", timeErr)
	}
	if rngErr != nil {
		return fmt.Errorf("reseed guest rng: %w", rngErr)
	}
	return nil
}

// freshenAndMount freshens a guest restored from a snapshot
// (freshenRestoredGuest) and, when the first container's rootfs was set in
// slot 0 before the guest ran (a template restore), mounts it in the same
// call (Freshen: one wake-up of the guest, not three); AttachRootfs then
// finds it mounted.
//
// Ordering: Freshen steps the clock before the mount, so the ext4 mount
// time is the real one. With an older agent the mount does not wait for
// the clock step and may record the template's time. The container is
// created only after all answered.
func (s *Sandbox) freshenAndMount(ctx context.Context, agent AgentClient) error {
	s.mu.Lock()
	first := len(s.slots) > 0 && s.slots[0].owner != "" && s.slots[0].vol == "" && s.restore == nil
	var sl slot
	if first {
		sl = s.slots[0]
	}
	s.mu.Unlock()
	if !first {
		return freshenRestoredGuest(ctx, agent, s.o.Log)
	}
	steps := NewSteps(time.Now())
	req := rootfsMountRequest(sl.serial)
	md, err := freshen(ctx, agent, s.o.Log, &req, sl.owner)
	if err != nil {
		return err
	}
	steps.Mark("mount")
	s.logRootfsAttached(sl.owner, sl.serial, steps, md)
	s.mu.Lock()
	s.slots[0].mountPoint = md.MountPoint
	s.mu.Unlock()
	return nil
}

// freshenSeparately is freshen for an agent without Freshen: SetTime,
// ReseedRandom and, with mount, MountDisk, issued together.
func freshenSeparately(ctx context.Context, agent AgentClient, entropy []byte, mount *MountDiskRequest, owner string) (MountedDisk, error) {
	if mount == nil {
		return MountedDisk{}, setTimeAndReseed(ctx, agent, entropy)
	}
	type mounted struct {
		md  MountedDisk
		err error
	}
	done := make(chan mounted, 1)
	go func() {
		md, err := agent.MountDisk(ctx, *mount)
		done <- mounted{md, err}
	}()
	err := setTimeAndReseed(ctx, agent, entropy)
	m := <-done
	if err != nil {
		return MountedDisk{}, err
	}
	if m.err != nil {
		return MountedDisk{}, fmt.Errorf("mount rootfs of %s in the guest: %w", owner, m.err)
	}
	return m.md, nil
}
