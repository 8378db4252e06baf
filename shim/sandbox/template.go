package sandbox

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"
)

// chooseTemplate sets o.Template from TemplateFor when a template can
// serve this sandbox, and logs why not when it cannot.
func (s *Sandbox) chooseTemplate(ctx context.Context) {
	if s.o.TemplateFor == nil || s.o.Template != "" || s.restore != nil {
		return
	}
	if s.o.Network != nil {
		// A template VM has no NIC, and a restored VM cannot gain one.
		s.o.Log.Info("cold boot: the sandbox has a network (its VM needs a NIC) and automatic templates have none")
		return
	}
	start := time.Now()
	dir, err := s.o.TemplateFor(ctx)
	if err != nil {
		s.o.Log.WithError(err).Warn("cold boot: no template")
		return
	}
	s.o.Log.WithFields(logrus.Fields{"template": dir, "took": time.Since(start).Round(time.Millisecond)}).Info("restoring from template")
	s.o.Template = dir
}

// freshenRestoredGuest fixes what a restore leaves stale: the guest clock
// resumes at snapshot time, and every VM restored from one template would
// share the template's RNG state. The two calls do not depend on each
// other: they are issued together (one round trip to the guest, not two).
func freshenRestoredGuest(ctx context.Context, agent AgentClient) error {
	entropy := make([]byte, 64)
	if _, err := rand.Read(entropy); err != nil {
		return fmt.Errorf("host entropy: %w", err)
	}
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
// slot 0 before the guest ran (a template restore), mounts it meanwhile;
// AttachRootfs then finds it mounted.
//
// Ordering: the mount does not wait for the clock step: it reads neither
// the clock nor the RNG but for the ext4 mount time, which may then be the
// template's. The container is created only after all three answered.
func (s *Sandbox) freshenAndMount(ctx context.Context, agent AgentClient) error {
	s.mu.Lock()
	first := len(s.slots) > 0 && s.slots[0].owner != "" && s.slots[0].vol == "" && s.restore == nil
	var sl slot
	if first {
		sl = s.slots[0]
	}
	s.mu.Unlock()
	if !first {
		return freshenRestoredGuest(ctx, agent)
	}
	type mounted struct {
		mp  string
		err error
	}
	done := make(chan mounted, 1)
	go func() {
		steps := NewSteps(time.Now())
		mp, err := agent.MountDisk(ctx, MountDiskRequest{Serial: sl.serial, FSType: "ext4"})
		steps.Mark("mount")
		s.o.Log.WithFields(logrus.Fields{"container": sl.owner, "serial": sl.serial, "steps_ms": steps.String()}).Info("rootfs attached")
		done <- mounted{mp, err}
	}()
	err := freshenRestoredGuest(ctx, agent)
	m := <-done
	if err != nil {
		return err
	}
	if m.err != nil {
		return fmt.Errorf("mount rootfs of %s in the guest: %w", sl.owner, m.err)
	}
	s.mu.Lock()
	s.slots[0].mountPoint = m.mp
	s.mu.Unlock()
	return nil
}
