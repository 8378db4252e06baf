package testhost

import "fmt"

// forwardArgs are QEMU's arguments for fw: one user-mode network (slirp) with restrict=on, so the test host
// can reach neither the machine nor the outside, and a hostfwd rule per port on the machine's loopback.
// romfile= leaves out the NIC's boot ROM (the test host boots with -kernel).
func forwardArgs(fw []Forward) []string {
	if len(fw) == 0 {
		return nil
	}
	netdev := "user,id=fwd,restrict=on,net=10.0.2.0/24"
	for _, f := range fw {
		netdev += fmt.Sprintf(",hostfwd=tcp:127.0.0.1:%d-%s:%d", f.HostPort, ForwardGuestAddr, f.GuestPort)
	}
	return []string{"-netdev", netdev, "-device", "virtio-net-pci,netdev=fwd,romfile="}
}

// forwardScript is the payload script's set-up of eth0 when there are forwards (withDefaults adds virtio_net
// to the modules stage 2 loads): up, with the address QEMU's user network forwards to. A failure stops the run
// before the payload (exit 1 from the script, with the reason on the payload's output).
func forwardScript(fw []Forward) string {
	if len(fw) == 0 {
		return ""
	}
	return "ip link set eth0 up && ip addr add " + ForwardGuestAddr + "/24 dev eth0 || " +
		"{ echo 'testhost: forwards: cannot configure eth0 (virtio_net in the test host kernel?)'; ip link; exit 1; }\n"
}

// validateForwards refuses ports out of range and a host port given twice.
func validateForwards(fw []Forward) error {
	seen := map[int]bool{}
	for i, f := range fw {
		if f.HostPort < 1 || f.HostPort > 65535 || f.GuestPort < 1 || f.GuestPort > 65535 {
			return fmt.Errorf("Options.Forwards[%d]: ports must be 1..65535, got host %d guest %d", i, f.HostPort, f.GuestPort)
		}
		if seen[f.HostPort] {
			return fmt.Errorf("Options.Forwards[%d]: host port %d is forwarded twice", i, f.HostPort)
		}
		seen[f.HostPort] = true
	}
	return nil
}
