package vmmcmd

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/cube-runtime/cube/hypervisor/machine"
	vnet "github.com/cube-runtime/cube/hypervisor/virtio/net"
)

// Net is one virtio-net device ([[net]] in the config file): a TAP backend,
// an existing tap cube-vmm attaches to by name or a tap fd the caller
// passed, or none (a device with nothing behind it: an automatic template's
// NIC, which a restore gives a tap), and the guest's MAC address.
type Net struct {
	Tap string `toml:"tap" json:"Tap,omitempty"` // interface name of an existing tap
	FD  int    `toml:"fd" json:"FD,omitempty"`   // or an attached tap fd inherited from the caller (>= 3)
	// None: no backend (vnet.Null): frames the guest sends are dropped,
	// none arrive. Omitted when false: a configuration without it records
	// what it did before (docs/snapshot.md, "Format versions").
	None bool   `toml:"none" json:"None,omitempty"`
	MAC  string `toml:"mac" json:"MAC"` // XX:XX:XX:XX:XX:XX; empty: a random locally administered one
}

const netUsage = "want tap=NAME|fd=N|none[,mac=XX:XX:XX:XX:XX:XX]"

// parseNet reads the -net flag form tap=NAME|fd=N|none[,mac=MAC]. Only the
// syntax is checked here; checkNets checks the tap itself.
func parseNet(s string) (Net, error) {
	var n Net
	seen := map[string]bool{}
	for _, p := range strings.Split(s, ",") {
		if p == "none" {
			if seen[p] {
				return n, fmt.Errorf("-net %q: none given twice", s)
			}
			seen[p], n.None = true, true
			continue
		}
		k, v, ok := strings.Cut(p, "=")
		if !ok || v == "" {
			return n, fmt.Errorf("-net %q: %q is not KEY=VALUE (%s)", s, p, netUsage)
		}
		if seen[k] {
			return n, fmt.Errorf("-net %q: %s given twice", s, k)
		}
		seen[k] = true
		switch k {
		case "tap":
			n.Tap = v
		case "fd":
			fd, err := strconv.Atoi(v)
			if err != nil || fd < 3 {
				return n, fmt.Errorf("-net %q: fd: %q is not a file descriptor >= 3", s, v)
			}
			n.FD = fd
		case "mac":
			if _, err := vnet.ParseMAC(v); err != nil {
				return n, fmt.Errorf("-net %q: %v", s, err)
			}
			n.MAC = v
		default:
			return n, fmt.Errorf("-net %q: unknown key %q (%s)", s, k, netUsage)
		}
	}
	if err := n.checkSyntax(); err != nil {
		return n, fmt.Errorf("-net %q: %v", s, err)
	}
	return n, nil
}

// checkSyntax checks what a config file may get wrong too.
func (n *Net) checkSyntax() error {
	switch {
	case n.None && (n.Tap != "" || n.FD != 0):
		return errors.New("none and tap= or fd= both given: one backend per device")
	case n.None:
	case n.Tap == "" && n.FD == 0:
		return fmt.Errorf("missing tap= (or fd=, or none): %s", netUsage)
	case n.Tap != "" && n.FD != 0:
		return errors.New("tap= and fd= both given: one backend per device")
	case n.FD != 0 && n.FD < 3:
		return fmt.Errorf("fd: %d is not a file descriptor >= 3", n.FD)
	}
	if n.Tap != "" {
		if err := vnet.CheckTapName(n.Tap); err != nil {
			return err
		}
	}
	if n.MAC != "" {
		if _, err := vnet.ParseMAC(n.MAC); err != nil {
			return err
		}
	}
	return nil
}

type netFlags []Net

func (n *netFlags) String() string { return fmt.Sprint(*n) }
func (n *netFlags) Set(s string) error {
	v, err := parseNet(s)
	if err != nil {
		return err
	}
	*n = append(*n, v)
	return nil
}

// checkNets refuses a net device whose tap is unknown, not a tap, or whose
// fd is not an attached tap (before the VM is made: exit 2), and gives a
// device without a MAC a random one, so the configuration a snapshot records
// has the address the guest saw.
func checkNets(nets []Net) error {
	for i := range nets {
		n := &nets[i]
		if err := n.checkSyntax(); err != nil {
			return fmt.Errorf("net %d: %v", i, err)
		}
		var err error
		switch {
		case n.None:
		case n.Tap != "":
			err = vnet.CheckTap(n.Tap)
		default:
			err = vnet.CheckTapFD(n.FD)
		}
		if err != nil {
			return fmt.Errorf("net %d: %v", i, err)
		}
		if n.MAC == "" {
			n.MAC = vnet.RandomMAC().String()
		}
	}
	return nil
}

// attachNets opens each tap and puts a virtio-net device on it on the bus
// (class 0x02/0x00, Ethernet controller). closers gets each device's Close.
func attachNets(m *machine.Machine, nets []Net, closers *[]func() error) error {
	for i, n := range nets {
		mac, err := vnet.ParseMAC(n.MAC)
		if err != nil {
			return fmt.Errorf("net %d: %v", i, err)
		}
		var be vnet.Backend
		switch {
		case n.None:
			be = vnet.NewNull()
		case n.Tap != "":
			be, err = vnet.OpenTap(n.Tap)
		default:
			be, err = vnet.TapFromFD(n.FD)
		}
		if err != nil {
			return fmt.Errorf("net %d: %w", i, err)
		}
		dev, err := vnet.New(vnet.Options{MAC: mac, Backend: be})
		if err != nil {
			be.Close()
			return fmt.Errorf("net %d: %w", i, err)
		}
		*closers = append(*closers, dev.Close)
		if _, err := m.AddVirtio(dev, 0x02, 0x00); err != nil {
			return fmt.Errorf("net %d: %w", i, err)
		}
	}
	return nil
}

// restoreNets applies restore's -net overrides (a new tap, fd or none for
// each device, in order; a mac must be the snapshot's: the guest has it
// cached) and refuses a device that used an fd of the snapshotted process
// without one. A device without a backend (none: an automatic template's)
// restores as one unless overridden.
func restoreNets(nets []Net, overrides []Net) error {
	if len(overrides) > 0 && len(overrides) != len(nets) {
		return fmt.Errorf("-net given %d times, the snapshot has %d net devices", len(overrides), len(nets))
	}
	for i, o := range overrides {
		if o.MAC != "" && !strings.EqualFold(o.MAC, nets[i].MAC) {
			return fmt.Errorf("net %d: mac %s, the snapshot's guest has %s (a restore cannot change it)", i, o.MAC, nets[i].MAC)
		}
		nets[i].Tap, nets[i].FD, nets[i].None = o.Tap, o.FD, o.None
	}
	for i, n := range nets {
		if len(overrides) == 0 && n.FD != 0 {
			return fmt.Errorf("net %d used fd %d of the snapshotted cube-vmm: give -net tap=NAME or fd=N", i, n.FD)
		}
	}
	return checkNets(nets)
}
