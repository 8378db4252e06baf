package initsys

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Module is one kernel module the guest needs, with its path relative to
// /lib/modules/<release>/ in Debian's linux-image-cloud-amd64 package.
type Module struct {
	Name string
	Path string
}

// Modules are the modules the agent loads at boot, in dependency order (each
// after everything its modinfo "depends=" names; checked against the pinned
// kernel package by TestModulesOrderMatchesKernelPackage). Everything else
// the agent needs (ext4, jbd2, crc32c, tmpfs, devtmpfs, cgroup2, unix
// sockets, devpts) is built into the Debian cloud kernel. The guest image
// builder copies exactly these files into the initramfs.
var Modules = []Module{
	{"virtio_ring", "kernel/drivers/virtio/virtio_ring.ko"},
	{"virtio", "kernel/drivers/virtio/virtio.ko"},
	{"virtio_pci_legacy_dev", "kernel/drivers/virtio/virtio_pci_legacy_dev.ko"},
	{"virtio_pci_modern_dev", "kernel/drivers/virtio/virtio_pci_modern_dev.ko"},
	{"virtio_pci", "kernel/drivers/virtio/virtio_pci.ko"},
	{"virtio_blk", "kernel/drivers/block/virtio_blk.ko"},
	{"vsock", "kernel/net/vmw_vsock/vsock.ko"},
	{"vmw_vsock_virtio_transport_common", "kernel/net/vmw_vsock/vmw_vsock_virtio_transport_common.ko"},
	{"vmw_vsock_virtio_transport", "kernel/net/vmw_vsock/vmw_vsock_virtio_transport.ko"},
	{"virtio_rng", "kernel/drivers/char/hw_random/virtio-rng.ko"},
	{"failover", "kernel/net/core/failover.ko"},
	{"net_failover", "kernel/drivers/net/net_failover.ko"},
	{"virtio_net", "kernel/drivers/net/virtio_net.ko"},
	{"fuse", "kernel/fs/fuse/fuse.ko"},
	{"virtiofs", "kernel/fs/fuse/virtiofs.ko"},
}

// ModuleLoader loads modules with finit_module(2).
type ModuleLoader struct {
	// Dir is /lib/modules/<release>.
	Dir string
	// SysModule is /sys/module, used to skip modules already present
	// (loaded earlier or built in).
	SysModule string
}

// NewModuleLoader returns a loader for the running kernel's module tree.
func NewModuleLoader() (*ModuleLoader, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return nil, fmt.Errorf("uname: %w", err)
	}
	rel := unix.ByteSliceToString(u.Release[:])
	return &ModuleLoader{Dir: filepath.Join("/lib/modules", rel), SysModule: "/sys/module"}, nil
}

// Load loads mods in order. A module that is already present is skipped;
// the first failure stops loading, because later modules depend on earlier ones.
func (l *ModuleLoader) Load(mods []Module) (loaded []string, err error) {
	for _, m := range mods {
		if _, err := os.Stat(filepath.Join(l.SysModule, m.Name)); err == nil {
			continue
		}
		if err := l.loadOne(m); err != nil {
			return loaded, err
		}
		loaded = append(loaded, m.Name)
	}
	return loaded, nil
}

func (l *ModuleLoader) loadOne(m Module) error {
	p := filepath.Join(l.Dir, m.Path)
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("load module %s: %w", m.Name, err)
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("load module %s: finit_module %s: %w", m.Name, p, err)
	}
	return nil
}

// ModInfo returns the key=value pairs of a module's .modinfo section.
// Module files come from a package we did not build: treat them as untrusted.
func ModInfo(ko []byte) (map[string][]string, error) {
	f, err := elf.NewFile(bytes.NewReader(ko))
	if err != nil {
		return nil, fmt.Errorf("modinfo: parse ELF: %w", err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, errors.New("modinfo: no .modinfo section")
	}
	if sec.Size > uint64(len(ko)) {
		return nil, fmt.Errorf("modinfo: section size %d exceeds file size %d", sec.Size, len(ko))
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("modinfo: read section: %w", err)
	}
	info := map[string][]string{}
	for _, kv := range bytes.Split(data, []byte{0}) {
		k, v, ok := strings.Cut(string(kv), "=")
		if !ok || k == "" {
			continue
		}
		info[k] = append(info[k], v)
	}
	return info, nil
}

// ModuleDepends returns the module names listed in a module's "depends=".
func ModuleDepends(ko []byte) ([]string, error) {
	info, err := ModInfo(ko)
	if err != nil {
		return nil, err
	}
	var deps []string
	for _, v := range info["depends"] {
		for d := range strings.SplitSeq(v, ",") {
			if d != "" {
				deps = append(deps, d)
			}
		}
	}
	return deps, nil
}

// ModuleNames are the names of Modules (modinfo names: underscores, e.g.
// virtio_rng whose file is virtio-rng.ko), for the guest image builder.
func ModuleNames() []string {
	names := make([]string, len(Modules))
	for i, m := range Modules {
		names[i] = m.Name
	}
	return names
}
