package machine

import (
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"syscall"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/hypervisor/acpi"
	"github.com/cube-runtime/cube/hypervisor/boot"
	"github.com/cube-runtime/cube/hypervisor/devices/pm"
	"github.com/cube-runtime/cube/hypervisor/devices/serial"
	"github.com/cube-runtime/cube/hypervisor/memory"
	"github.com/cube-runtime/cube/hypervisor/vcpu"
)

// Loading a Linux boot image (New): the kernel, decompressed on the host
// when configured, the firmware tables and the boot vCPUs.

// loadBoot writes the ACPI tables, the reset stub and the boot image
// (kernel, command line, initrd, zero page) into guest memory.
func (m *Machine) loadBoot(ram []memory.Range, kernel *boot.Kernel, initrd []byte) (*boot.Loaded, error) {
	cfg := acpi.Config{
		Base: boot.ACPIAddr, CPUs: m.cfg.VCPUs,
		SleepPort: pm.SleepPort, ResetPort: pm.ResetPort, ResetValue: pm.ResetValue,
		PCI:    &acpi.PCIWindows{MMIO32Base: PCIMMIO32Base, MMIO32Size: PCIMMIO32Size, MMIO64Base: m.pci64, MMIO64Size: PCIMMIO64Size},
		Serial: []acpi.SerialPort{{Base: serial.COM1Base, GSI: serial.COM1IRQ}},
	}
	if m.genid != nil {
		cfg.VMGenID = &acpi.VMGenID{Addr: m.genid.Addr(), GSI: m.genid.GSI()}
	}
	tables, err := acpi.Build(cfg)
	if err != nil {
		return nil, err
	}
	if len(tables) > boot.VMGenIDAddr-boot.ACPIAddr {
		return nil, fmt.Errorf("ACPI tables of %d bytes overflow the BIOS area below the generation id", len(tables))
	}
	if _, err = m.mem.WriteAt(tables, boot.ACPIAddr); err != nil {
		return nil, fmt.Errorf("write ACPI tables: %w", err)
	}
	if m.genid != nil {
		// The first id: the guest's driver reads it at probe.
		if err := m.genid.Generate(); err != nil {
			return nil, err
		}
	}
	if _, err = m.mem.WriteAt(boot.ResetStub(pm.ResetPort, pm.ResetValue), boot.ResetVector); err != nil {
		return nil, fmt.Errorf("write reset stub: %w", err)
	}
	return boot.Setup(m.mem, ram, boot.Image{Kernel: kernel, Cmdline: m.cfg.Cmdline, Initrd: initrd, RSDPAddr: boot.ACPIAddr})
}

// addBootVCPUs creates the vCPUs, configured for the loaded kernel: the
// boot processor at its entry point, the others waiting for INIT/SIPI.
func (m *Machine) addBootVCPUs(loaded *boot.Loaded) error {
	supported, err := m.sys.SupportedCPUID()
	if err != nil {
		return err
	}
	for i := 0; i < m.cfg.VCPUs; i++ {
		c, err := m.vm.CreateVCPU(i)
		if err != nil {
			return err
		}
		v := vcpu.New(c, &m.pio, &m.mmio)
		if m.log.Logger.IsLevelEnabled(logrus.TraceLevel) {
			v.Unclaimed = m.logUnclaimed
		}
		m.cpus = append(m.cpus, v)
		if err := boot.ConfigureVCPU(c, supported, m.cfg.VCPUs, loaded.Entry, loaded.ZeroPage); err != nil {
			return err
		}
	}
	return nil
}

// loadKernel parses the kernel image, decompressing a bzImage on the host
// (through the cache) when configured. The returned func releases any
// cache mapping the kernel's segments point into.
func loadKernel(cfg Config, img []byte) (*boot.Kernel, func(), error) {
	nop := func() {}
	bz, err := boot.ParseBzImage(img)
	if err != nil || !cfg.Decompress {
		k, err := boot.LoadKernel(img)
		return k, nop, err
	}
	var cachePath string
	if cfg.KernelCache != "" {
		if fi, err := os.Stat(cfg.Kernel); err == nil {
			var ino uint64
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				ino = st.Ino
			}
			h := fnv.New64a()
			fmt.Fprintf(h, "%s\x00%d\x00%d\x00%d", cfg.Kernel, fi.Size(), fi.ModTime().UnixNano(), ino)
			cachePath = filepath.Join(cfg.KernelCache, fmt.Sprintf("vmlinux-%016x", h.Sum64()))
			if elfImg, unmap, err := mapFile(cachePath); err == nil {
				if k, err := boot.WithSetupOf(elfImg, bz); err == nil {
					cfg.Log.WithField("cache", cachePath).Debug("kernel from cache")
					return k, unmap, nil
				}
				unmap()
			}
		}
	}
	k, elfImg, err := boot.DecompressBzImageELF(img)
	if err != nil {
		// The guest can always decompress itself.
		cfg.Log.WithError(err).Debug("host-side kernel decompression unavailable")
		k, err := boot.LoadKernel(img)
		return k, nop, err
	}
	if cachePath != "" {
		// Write-then-rename, so concurrent VMMs never map a partial file.
		if err := os.MkdirAll(cfg.KernelCache, 0o755); err == nil {
			tmp := fmt.Sprintf("%s.%d.tmp", cachePath, os.Getpid())
			if err := os.WriteFile(tmp, elfImg, 0o644); err == nil {
				if err := os.Rename(tmp, cachePath); err != nil {
					os.Remove(tmp)
				}
			}
		}
	}
	return k, nop, nil
}

// mapFile maps a whole file read-only.
func mapFile(path string) ([]byte, func(), error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%s is not a regular file", path)
	}
	if fi.Size() == 0 {
		return nil, nil, fmt.Errorf("%s is empty", path)
	}
	b, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_PRIVATE)
	if err != nil {
		return nil, nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	return b, func() { unix.Munmap(b) }, nil
}
