package cli

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cube-runtime/cube/shim/config"
	"github.com/cube-runtime/cube/shim/standby"
	"github.com/cube-runtime/cube/shim/template"
)

const templatesHelp = `Usage: cube templates COMMAND [--dir DIR] [--config FILE]

Manages the shim's automatic templates: one pre-booted VM snapshot per
sandbox shape (kernel, initrd, cube-vmm, cmdline, memory, vCPUs, drive
slots) that new sandboxes are restored from (docs/shim.md, "Templates").
A shim makes one on first use; a changed kernel, initrd or cube-vmm makes
a new one and leaves the old one here until it is removed.

Commands:
  ls        list them: key, size on disk, when made, what for, standby VMs
            ready for the next sandbox; failed builds too
  rm KEY... remove templates (refused while a shim is building that key)
            and stop their free standby VMs; running sandboxes restored
            from one keep running

Flags:
  --dir DIR       the template directory (default: template_dir of --config)
  --config FILE   the shim config (default /etc/cube/shim.toml; defaults if absent)
`

// templates is `cube templates ls|rm`.
func (r *runner) templates(_ context.Context, args []string) int {
	const cmd = "cube templates"
	fs := r.flagSet(cmd)
	dir := fs.String("dir", "", "template directory")
	conf := fs.String("config", "", "shim config")
	r.g.register(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return r.parseFailed(cmd, templatesHelp, err)
	}
	if len(pos) == 0 {
		return r.usageError(cmd, "want a command: ls or rm")
	}
	// The standbys are under the shim's state_dir (config); with --dir and
	// an unreadable config, they are left alone.
	c, cerr := config.Load(*conf)
	if *dir == "" {
		if cerr != nil {
			return r.fail(cmd, fmt.Errorf("%w (or name the template directory with --dir)", cerr))
		}
		*dir = c.TemplateDir
	}
	stateDir := ""
	if cerr == nil {
		stateDir = c.StateDir
	}
	switch pos[0] {
	case "ls", "list":
		if len(pos) != 1 {
			return r.usageError(cmd+" ls", "takes no arguments")
		}
		return r.templatesLs(*dir, stateDir)
	case "rm", "remove":
		if len(pos) < 2 {
			return r.usageError(cmd+" rm", "want one or more keys")
		}
		code := ExitOK
		for _, k := range pos[1:] {
			if err := template.Remove(*dir, k); err != nil {
				code = r.fail(cmd+" rm", err)
				continue
			}
			if stateDir != "" {
				if _, err := standby.Stop(stateDir, filepath.Join(*dir, k, "vm")); err != nil {
					code = r.fail(cmd+" rm", fmt.Errorf("template %s removed, but its standby VMs: %w", k, err))
					continue
				}
			}
			fmt.Fprintln(r.env.Stdout, k)
		}
		return code
	}
	return r.usageError(cmd, fmt.Sprintf("unknown command %q (commands: ls, rm)", pos[0]))
}

func (r *runner) templatesLs(dir, stateDir string) int {
	list, err := template.List(dir)
	if err != nil {
		return r.fail("cube templates ls", err)
	}
	standbys := map[string]int{}
	if stateDir != "" {
		sbs, err := standby.List(stateDir)
		if err != nil {
			return r.fail("cube templates ls", err)
		}
		for _, sb := range sbs {
			standbys[sb.Record.Template]++
		}
	}
	w := tabwriter.NewWriter(r.env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "KEY\tSIZE\tCREATED\tFOR")
	for _, t := range list {
		if t.Failed != "" {
			fmt.Fprintf(w, "%s\t-\t-\tbuild failed: %s\n", t.Key, t.Failed)
			continue
		}
		created, what := "?", "? (no template.json)"
		if t.Meta.Key != "" {
			s := t.Meta.Shape
			created = t.Meta.Created.Local().Format(time.DateTime)
			what = fmt.Sprintf("%d MiB, %d vCPU, %d slots, %d NICs, kernel %s, initrd %s (%s), vmm %s",
				s.MemoryMiB, s.VCPUs, s.DiskSlots, s.NICs, filepath.Base(s.Kernel), filepath.Base(s.Initrd),
				short(t.Meta.Digests["initrd"]), filepath.Base(s.VMM))
			if t.Meta.Version != template.Version {
				// Its key was computed another way: no shim finds it.
				what += fmt.Sprintf("; layout %s, not used by this shim (%s): remove it", t.Meta.Version, template.Version)
			}
		}
		if n := standbys[filepath.Join(dir, t.Key, "vm")]; n > 0 {
			what += fmt.Sprintf("; %d standby VM(s) ready", n)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", t.Key, bytesHuman(t.Bytes), created, what)
	}
	w.Flush()
	return ExitOK
}

func short(digest string) string {
	if len(digest) > 12 {
		return "sha256:" + digest[:12]
	}
	return strings.TrimSpace(digest)
}
