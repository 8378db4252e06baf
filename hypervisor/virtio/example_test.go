package virtio_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/cube-runtime/cube/hypervisor/pci"
	"github.com/cube-runtime/cube/hypervisor/virtio"
	"github.com/cube-runtime/cube/hypervisor/virtio/blk"
	"github.com/cube-runtime/cube/hypervisor/virtio/rng"
	"github.com/cube-runtime/cube/hypervisor/virtio/virtiotest"
)

type noMSI struct{}

func (noMSI) SignalMSI(addr uint64, data uint32) error { return nil } // KVM_SIGNAL_MSI in the VMM

// Example shows the VMM glue: a bus, devices wrapped in virtio-pci
// transports, and the address ranges the VMM must route to the bus.
func Example() {
	mem := virtiotest.NewMemory(64 << 20) // the VMM's guest memory in real use
	dirty := virtio.NewDirtyBitmap(64 << 20)

	bus := pci.NewBus(pci.Window{Base: 0xC000_0000, Size: 0x1000_0000}, pci.Window{})

	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	img := filepath.Join(dir, "disk.img")
	_ = os.WriteFile(img, make([]byte, 1<<20), 0o644)
	disk, err := blk.Open(blk.Options{Path: img, Serial: "root"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer disk.Close()

	for _, dev := range []virtio.Device{disk, rng.New()} {
		tr, err := virtio.NewPCI(dev, virtio.PCIOptions{Mem: mem, Dirty: dirty, MSI: noMSI{}, Class: 0xFF})
		if err != nil {
			fmt.Println(err)
			return
		}
		slot, err := bus.Add(tr)
		if err != nil {
			fmt.Println(err)
			return
		}
		base := tr.Config().BARAddress(virtio.BARIndex)
		fmt.Printf("slot %d: device %d, BAR0 %#x, queue 0 notify at %#x\n",
			slot, dev.DeviceID(), base, virtio.NotifyAddress(base, 0))
	}
	for _, r := range bus.Regions() {
		fmt.Printf("mmio %#x-%#x -> slot %d bar %d\n", r.Base, r.Base+r.Size-1, r.Slot, r.BAR)
	}
	// Output:
	// slot 1: device 2, BAR0 0xc0000000, queue 0 notify at 0xc0003000
	// slot 2: device 4, BAR0 0xc0008000, queue 0 notify at 0xc000b000
	// mmio 0xc0000000-0xc0007fff -> slot 1 bar 0
	// mmio 0xc0008000-0xc000ffff -> slot 2 bar 0
}
