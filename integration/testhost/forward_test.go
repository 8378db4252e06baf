package testhost

import (
	"slices"
	"strings"
	"testing"
)

func TestForwardArgs(t *testing.T) {
	if a := forwardArgs(nil); a != nil {
		t.Errorf("no forwards: %v, want none (no NIC at all)", a)
	}
	a := forwardArgs([]Forward{{HostPort: 38080, GuestPort: 3000}, {HostPort: 38081, GuestPort: 3001}})
	want := []string{"-netdev", "user,id=fwd,restrict=on,net=10.0.2.0/24,hostfwd=tcp:127.0.0.1:38080-10.0.2.15:3000,hostfwd=tcp:127.0.0.1:38081-10.0.2.15:3001",
		"-device", "virtio-net-pci,netdev=fwd,romfile="}
	if !slices.Equal(a, want) {
		t.Errorf("forwardArgs = %q\nwant %q", a, want)
	}
	if s := forwardScript(nil); s != "" {
		t.Errorf("no forwards: script %q", s)
	}
	if s := forwardScript([]Forward{{1, 2}}); !strings.Contains(s, "ip addr add 10.0.2.15/24 dev eth0") || !strings.Contains(s, "exit 1") {
		t.Errorf("script %q: no eth0 set-up or no failure exit", s)
	}
}

func TestForwardsValidatedAndLoadVirtioNet(t *testing.T) {
	for _, bad := range [][]Forward{{{0, 1}}, {{1, 70000}}, {{5000, 1}, {5000, 2}}} {
		if err := validateForwards(bad); err == nil || !strings.Contains(err.Error(), "Options.Forwards[") {
			t.Errorf("%v: %v, want a refusal naming Options.Forwards", bad, err)
		}
	}
	if err := validateForwards([]Forward{{5000, 3000}, {5001, 3000}}); err != nil {
		t.Errorf("two host ports to one guest port: %v", err)
	}
	o := Options{Modules: []string{"tun"}, Forwards: []Forward{{5000, 3000}}}
	if m := o.withDefaults().Modules; !slices.Equal(m, []string{"tun", "virtio_net"}) {
		t.Errorf("modules with forwards: %v", m)
	}
	plain := Options{Modules: []string{"tun"}}
	if m := plain.withDefaults().Modules; !slices.Equal(m, []string{"tun"}) {
		t.Errorf("modules without forwards: %v", m)
	}
}
