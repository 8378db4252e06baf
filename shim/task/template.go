package task

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/shim/config"
	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/template"
)

// templateFor returns the sandbox's TemplateFor for cfg: nil when
// templates are off or the config names a template itself.
func templateFor(cfg config.Config, to config.Timeouts, log *logrus.Entry) func(context.Context, int) (sandbox.TemplateVM, error) {
	if !cfg.Templates || cfg.Template != "" {
		return nil
	}
	cache := &template.Cache{
		Root: cfg.TemplateDir, Wait: to.TemplateWait, Log: log,
		Build: BuildTemplate(to, log),
		// A boot, the agent's answer and one snapshot.
		BuildTimeout: to.Boot + to.Agent,
	}
	return func(ctx context.Context, nics int) (sandbox.TemplateVM, error) {
		shape := ShapeOf(cfg)
		shape.NICs = nics
		dir, err := cache.Get(ctx, shape)
		if err != nil {
			return sandbox.TemplateVM{}, err
		}
		t := sandbox.TemplateVM{Dir: dir}
		if nics > 0 {
			// The snapshot's own record, not the recipe's constant: what
			// the guest's devices really have.
			if t.NICMACs, err = snapshotNICMACs(dir); err != nil {
				return sandbox.TemplateVM{}, fmt.Errorf("template %s: %w", dir, err)
			}
		}
		return t, nil
	}
}

// ShapeOf is the template shape of the sandboxes cfg makes (without a
// network: NICs is the sandbox's to set).
func ShapeOf(cfg config.Config) template.Shape {
	return template.Shape{
		VMM: cfg.VMM, Kernel: cfg.Kernel, Initrd: cfg.Initrd, Cmdline: cfg.Cmdline,
		MemoryMiB: cfg.MemoryMiB, VCPUs: cfg.VCPUs, DiskSlots: int(cfg.DiskSlots),
	}
}

// BuildTemplate is the template recipe: a VM of the shape cold-booted with
// stub drives in every slot and shape.NICs NICs without a backend
// (cube-vmm -net none, MACs sandbox.TemplateNICMAC: a restore gives each
// the sandbox's tap), as a template restore starts, snapshotted once its
// agent answers, then stopped. The guest's interfaces stay unconfigured
// (down, no address) until a restored sandbox's agent configures them.
func BuildTemplate(to config.Timeouts, log *logrus.Entry) template.BuildFunc {
	return func(ctx context.Context, shape template.Shape, work, snapDir string) error {
		vlog := log.WithField("template-build", work)
		vmm := &sandbox.ProcessVMM{Binary: shape.VMM, Log: vlog}
		o := sandbox.Options{
			ID: "template", Dir: work, Kernel: shape.Kernel, Initrd: shape.Initrd, Cmdline: shape.Cmdline,
			MemoryMiB: shape.MemoryMiB, VCPUs: shape.VCPUs, DiskSlots: shape.DiskSlots, BootTimeout: to.Boot,
			VMM: vmm, Dial: sandbox.DialAgentTimeout(to.Agent), Log: vlog,
		}
		if shape.NICs > 0 {
			o.Network = templateNetwork(shape.NICs)
		}
		sb, err := sandbox.New(o)
		if err != nil {
			return err
		}
		start := time.Now()
		if err := sb.Start(ctx, "", ""); err != nil {
			return fmt.Errorf("boot the template VM: %w", err)
		}
		defer sb.Stop(context.WithoutCancel(ctx))
		booted := time.Since(start)
		// A spare container helper parked in the template: the first
		// container of each sandbox restored from it skips the helper's
		// fork and start and its new network namespace.
		spare, err := sb.Agent().PrepareSpare(ctx)
		if err != nil {
			if !errdefs.IsFailedPrecondition(err) {
				return fmt.Errorf("park a spare container helper in the template VM: %w", err)
			}
			vlog.WithError(err).Warn("template without a spare container helper")
		}
		// Ordering: the agent connection is closed before the snapshot: a
		// live connection would be carried into every restored VM.
		sb.Agent().Close()
		start = time.Now()
		if _, err := vmm.Snapshot(ctx, snapDir, false); err != nil {
			return fmt.Errorf("snapshot the template VM: %w", err)
		}
		vlog.WithFields(logrus.Fields{"boot": booted.Round(time.Millisecond), "spare_ms": spare,
			"snapshot": time.Since(start).Round(time.Millisecond)}).Info("template VM booted and snapshotted")
		return nil
	}
}

// templateNetwork is a template VM's network: NICs with no backend and
// nothing for the guest to configure.
type templateNetwork int

func (n templateNetwork) Attach(context.Context) (sandbox.NetworkAttachment, error) {
	var a sandbox.NetworkAttachment
	for i := 0; i < int(n); i++ {
		a.NICs = append(a.NICs, sandbox.NIC{NoBackend: true, MAC: sandbox.TemplateNICMAC(i)})
	}
	return a, nil
}

func (templateNetwork) Detach(context.Context) error { return nil }

// snapshotNICMACs are the MACs of a VM snapshot's virtio-net devices, in
// order, from its manifest.
func snapshotNICMACs(vm string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(vm, snapshot.ManifestName))
	if err != nil {
		return nil, err
	}
	m, err := snapshot.ParseManifest(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
	}
	return manifestNICMACs(m)
}
