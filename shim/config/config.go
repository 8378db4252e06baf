// Package config is the shim's TOML configuration: what VM each sandbox gets
// (kernel, initrd with the guest agent, memory, vCPUs, disks) and where the
// VMM binary and the sandbox state live. Every field has a documented default.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/pelletier/go-toml/v2"
)

// DefaultPath is read when the runtime options name no config file.
const DefaultPath = "/etc/cube/shim.toml"

// Defaults. Memory and vCPUs are per sandbox VM (a CRI pod shares one VM).
const (
	DefaultVMMPath     = "cube-vmm"
	DefaultKernel      = "/usr/share/cube/vmlinuz"
	DefaultInitrd      = "/usr/share/cube/initrd.img"
	DefaultCmdline     = "console=ttyS0 quiet panic=-1 reboot=k"
	DefaultMemoryMiB   = 256
	DefaultVCPUs       = 1
	DefaultDiskSlots   = 8
	DefaultStateDir    = "/run/cube/shim"
	DefaultBootTimeout = "30s"
	// DefaultAgentTimeout bounds one agent call (all but waiting for a process): generous, since an
	// emulated test host is slow, and short of the minutes a stalled guest would otherwise hang a request.
	DefaultAgentTimeout = "2m"
	// DefaultTemplateDir holds the automatic templates: persistent, so a reboot does not cost a rebuild
	// (a new kernel, initrd or cube-vmm changes the key and makes a new one).
	DefaultTemplateDir = "/var/lib/cube/templates"
	// DefaultTemplateWait is how long a sandbox waits for another shim's template build before it
	// cold-boots: longer than a build takes on a slow (emulated) host.
	DefaultTemplateWait = "60s"
	// MaxMemoryMiB and MaxVCPUs bound user input; beyond them a typo is likelier than intent.
	MaxMemoryMiB = 1 << 20
	MaxVCPUs     = 255
	MaxDiskSlots = 64
)

// Config is the file's content. Field comments are the documentation of the
// TOML keys (docs/shim.md repeats them with an example).
type Config struct {
	// VMM is the cube-vmm binary: an absolute path or a name looked up in PATH.
	VMM string `toml:"vmm"`
	// Kernel is the guest kernel (bzImage).
	Kernel string `toml:"kernel"`
	// Initrd is the initramfs whose /init is the guest agent.
	Initrd string `toml:"initrd"`
	// Cmdline is the guest kernel command line.
	Cmdline string `toml:"cmdline"`
	// MemoryMiB is the guest memory of each sandbox VM.
	MemoryMiB uint32 `toml:"memory_mib"`
	// VCPUs is the number of vCPUs of each sandbox VM.
	VCPUs uint32 `toml:"vcpus"`
	// DiskSlots is how many container rootfs disks a sandbox VM can take
	// (pre-created drive slots whose backing file is set at Create).
	DiskSlots uint32 `toml:"disk_slots"`
	// StateDir holds per-sandbox sockets, stub disks and the console log.
	StateDir string `toml:"state_dir"`
	// BootTimeout bounds VMM start until the agent answers Health (Go duration).
	BootTimeout string `toml:"boot_timeout"`
	// AgentTimeout bounds each call to the guest agent after boot (mount, create, exec, start, signal,
	// delete, ...; not the wait for a process to exit), Go duration. A call past it fails its request with
	// "guest agent: <call> got no answer within <d>".
	AgentTimeout string `toml:"agent_timeout"`
	// CgroupParent, when set, is the cgroup (v1 path or v2 group) the VMM
	// process is placed under when the container spec names no cgroupsPath.
	CgroupParent string `toml:"cgroup_parent"`
	// Template, when set, is a pre-booted template snapshot (a directory in
	// the VM snapshot format) the VM is restored from instead of cold-booting:
	// cube-vmm gets --restore, all drive slots start as stubs, and the shim
	// steps the guest clock and reseeds its RNG before the first container.
	Template string `toml:"template"`
	// Templates: when true (the default) and no Template is named, each sandbox is restored from an
	// automatic template of its shape (kernel, initrd, cube-vmm, cmdline, memory, vCPUs, disk slots),
	// made on first use under TemplateDir (boot once, wait for the agent, snapshot) and reused after.
	// Sandboxes a template cannot serve (a network, a restore) cold-boot and the shim logs why; so do
	// all when this is false, or when a template cannot be made.
	Templates bool `toml:"templates"`
	// TemplateDir holds the automatic templates, one directory per key (`cube templates ls|rm`).
	TemplateDir string `toml:"template_dir"`
	// TemplateWait bounds how long a sandbox waits for a template another shim is making (Go
	// duration); past it the sandbox cold-boots.
	TemplateWait string `toml:"template_wait"`
	// Standby: when true, a sandbox restored from a template (without a network) leaves one standby VM
	// of that template behind, restored at idle CPU priority, and the next such sandbox adopts it
	// instead of restoring its own: the VMM's start and the restore are then off its path. At most one
	// free standby per template; `cube templates rm` stops them (docs/shim.md, *Standby VMs*). Off by
	// default: on a host without idle CPU, making the next standby costs a start what adopting saved.
	Standby bool `toml:"standby"`
	// HugeTLB: a cold-booted sandbox VM takes its memory from the host's 2 MiB hugetlb pool
	// (cube-vmm -hugetlb; docs/vmm.md): memory_mib/2 free pages must be in it (vm.nr_hugepages), or the
	// sandbox fails to start; memory_mib must be even. Restores (templates) map their snapshot with small
	// pages whatever this says.
	HugeTLB bool `toml:"hugetlb"`
}

// Default returns a Config holding every default.
func Default() Config {
	return Config{
		VMM:          DefaultVMMPath,
		Kernel:       DefaultKernel,
		Initrd:       DefaultInitrd,
		Cmdline:      DefaultCmdline,
		MemoryMiB:    DefaultMemoryMiB,
		VCPUs:        DefaultVCPUs,
		DiskSlots:    DefaultDiskSlots,
		StateDir:     DefaultStateDir,
		BootTimeout:  DefaultBootTimeout,
		AgentTimeout: DefaultAgentTimeout,
		Templates:    true,
		TemplateDir:  DefaultTemplateDir,
		TemplateWait: DefaultTemplateWait,
	}
}

// Parse decodes TOML over the defaults: keys absent from data keep their
// default. Unknown keys are errors so a misspelt key is not silently ignored.
func Parse(data []byte) (Config, error) {
	c := Default()
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		var sm *toml.StrictMissingError
		if errors.As(err, &sm) {
			return Config{}, fmt.Errorf("parse shim config: %s", sm.String())
		}
		return Config{}, fmt.Errorf("parse shim config: %w", err)
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Load reads path. A missing file at DefaultPath yields the defaults; a
// missing file named explicitly is an error.
func Load(path string) (Config, error) {
	explicit := path != ""
	if !explicit {
		path = DefaultPath
	}
	data, err := os.ReadFile(path)
	if err != nil {
		if !explicit && errors.Is(err, os.ErrNotExist) {
			return Default(), nil
		}
		return Config{}, fmt.Errorf("read shim config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Validate checks ranges and paths.
func (c Config) Validate() error {
	if c.VMM == "" {
		return errors.New("shim config: vmm is empty")
	}
	if c.Kernel == "" {
		return errors.New("shim config: kernel is empty")
	}
	if c.MemoryMiB == 0 || c.MemoryMiB > MaxMemoryMiB {
		return fmt.Errorf("shim config: memory_mib %d out of range 1..%d", c.MemoryMiB, MaxMemoryMiB)
	}
	if c.VCPUs == 0 || c.VCPUs > MaxVCPUs {
		return fmt.Errorf("shim config: vcpus %d out of range 1..%d", c.VCPUs, MaxVCPUs)
	}
	if c.DiskSlots == 0 || c.DiskSlots > MaxDiskSlots {
		return fmt.Errorf("shim config: disk_slots %d out of range 1..%d", c.DiskSlots, MaxDiskSlots)
	}
	if !filepath.IsAbs(c.StateDir) {
		return fmt.Errorf("shim config: state_dir %q is not absolute", c.StateDir)
	}
	if !filepath.IsAbs(c.TemplateDir) {
		return fmt.Errorf("shim config: template_dir %q is not absolute", c.TemplateDir)
	}
	if c.HugeTLB && c.MemoryMiB%2 != 0 {
		return fmt.Errorf("shim config: memory_mib %d with hugetlb: must be even (whole 2 MiB pages)", c.MemoryMiB)
	}
	if _, err := c.Durations(); err != nil {
		return err
	}
	return nil
}

// Timeouts are the parsed duration fields.
type Timeouts struct {
	Boot  time.Duration
	Agent time.Duration
	// TemplateWait: see Config.TemplateWait.
	TemplateWait time.Duration
}

// Durations parses the duration fields.
func (c Config) Durations() (Timeouts, error) {
	b, err := parseDuration("boot_timeout", c.BootTimeout)
	if err != nil {
		return Timeouts{}, err
	}
	a, err := parseDuration("agent_timeout", c.AgentTimeout)
	if err != nil {
		return Timeouts{}, err
	}
	w, err := parseDuration("template_wait", c.TemplateWait)
	if err != nil {
		return Timeouts{}, err
	}
	return Timeouts{Boot: b, Agent: a, TemplateWait: w}, nil
}

func parseDuration(key, s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("shim config: %s: %w", key, err)
	}
	if d <= 0 {
		return 0, fmt.Errorf("shim config: %s %q must be positive", key, s)
	}
	return d, nil
}
