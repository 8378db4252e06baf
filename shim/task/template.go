package task

import (
	"context"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/shim/config"
	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/template"
)

// templateFor returns the sandbox's TemplateFor for cfg: nil when
// templates are off or the config names a template itself.
func templateFor(cfg config.Config, to config.Timeouts, log *logrus.Entry) func(context.Context) (string, error) {
	if !cfg.Templates || cfg.Template != "" {
		return nil
	}
	cache := &template.Cache{
		Root: cfg.TemplateDir, Wait: to.TemplateWait, Log: log,
		Build: BuildTemplate(to, log),
		// A boot, the agent's answer and one snapshot.
		BuildTimeout: to.Boot + to.Agent,
	}
	shape := ShapeOf(cfg)
	return func(ctx context.Context) (string, error) { return cache.Get(ctx, shape) }
}

// ShapeOf is the template shape of the sandboxes cfg makes.
func ShapeOf(cfg config.Config) template.Shape {
	return template.Shape{
		VMM: cfg.VMM, Kernel: cfg.Kernel, Initrd: cfg.Initrd, Cmdline: cfg.Cmdline,
		MemoryMiB: cfg.MemoryMiB, VCPUs: cfg.VCPUs, DiskSlots: int(cfg.DiskSlots),
	}
}

// BuildTemplate is the template recipe: a VM of the shape cold-booted with
// stub drives in every slot and no NIC (as a template restore starts),
// snapshotted once its agent answers, then stopped.
func BuildTemplate(to config.Timeouts, log *logrus.Entry) template.BuildFunc {
	return func(ctx context.Context, shape template.Shape, work, snapDir string) error {
		vlog := log.WithField("template-build", work)
		vmm := &sandbox.ProcessVMM{Binary: shape.VMM, Log: vlog}
		sb, err := sandbox.New(sandbox.Options{
			ID: "template", Dir: work, Kernel: shape.Kernel, Initrd: shape.Initrd, Cmdline: shape.Cmdline,
			MemoryMiB: shape.MemoryMiB, VCPUs: shape.VCPUs, DiskSlots: shape.DiskSlots, BootTimeout: to.Boot,
			VMM: vmm, Dial: sandbox.DialAgentTimeout(to.Agent), Log: vlog,
		})
		if err != nil {
			return err
		}
		start := time.Now()
		if err := sb.Start(ctx, "", ""); err != nil {
			return fmt.Errorf("boot the template VM: %w", err)
		}
		defer sb.Stop(context.WithoutCancel(ctx))
		booted := time.Since(start)
		// Ordering: the agent connection is closed before the snapshot: a
		// live connection would be carried into every restored VM.
		sb.Agent().Close()
		start = time.Now()
		if _, err := vmm.Snapshot(ctx, snapDir, false); err != nil {
			return fmt.Errorf("snapshot the template VM: %w", err)
		}
		vlog.WithFields(logrus.Fields{"boot": booted.Round(time.Millisecond), "snapshot": time.Since(start).Round(time.Millisecond)}).Info("template VM booted and snapshotted")
		return nil
	}
}
