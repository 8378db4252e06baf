package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/sandbox/sandboxtest"
)

// nicNetwork is a fakeNetwork that says how many NICs it gives (a
// sandbox.NICCounter, as shim/podnet's networks are).
type nicNetwork struct{ *fakeNetwork }

func (nicNetwork) NICCount() int { return 1 }

const tmplMAC = "02:cb:00:00:00:01"

// TestChooseTemplate: Start restores from TemplateFor's template when one
// can serve the sandbox (its stubs used as they are, the rootfs set in slot
// 0 before the guest runs, the guest's clock and RNG refreshed) — one
// without NICs for a sandbox without a network, one with its network's NIC
// count for a networked one (its taps replace the template's NICs, the
// agent moves each guest interface from the template's MAC to the
// network's) — and cold-boots without asking for one when the config names
// a template or the network does not say how many NICs it gives, or when
// TemplateFor fails or gives another NIC count.
func TestChooseTemplate(t *testing.T) {
	cases := []struct {
		name     string
		network  string // "", "counted", "uncounted"
		explicit string
		err      error
		macs     []string // the template's NICs
		asked    bool
		nics     int // what TemplateFor was asked for
		want     string
	}{
		{name: "template", asked: true, want: "/tmpl/abc/vm"},
		{name: "no template: cold boot", err: errors.New("build failed"), asked: true, want: ""},
		{name: "network: NIC template", network: "counted", macs: []string{tmplMAC}, asked: true, nics: 1, want: "/tmpl/abc/vm"},
		{name: "network: template with another NIC count: cold boot", network: "counted", asked: true, nics: 1, want: ""},
		{name: "network of unknown NIC count: cold boot", network: "uncounted", asked: false, want: ""},
		{name: "explicit template wins", explicit: "/mine", asked: false, want: "/mine"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			agent := sandboxtest.NewAgent()
			vmm := sandboxtest.NewVMM(agent)
			asked, askedNICs := false, -1
			o := sandbox.Options{ID: "sb1", Dir: filepath.Join(t.TempDir(), "sb"), DiskSlots: 2, Template: c.explicit,
				VMM: vmm, Dial: sandboxtest.Dialer(agent), BootTimeout: time.Second,
				TemplateFor: func(_ context.Context, nics int) (sandbox.TemplateVM, error) {
					asked, askedNICs = true, nics
					return sandbox.TemplateVM{Dir: "/tmpl/abc/vm", NICMACs: c.macs}, c.err
				}}
			switch c.network {
			case "counted":
				o.Network = nicNetwork{&fakeNetwork{}}
			case "uncounted":
				o.Network = &fakeNetwork{}
			}
			sb, err := sandbox.New(o)
			if err != nil {
				t.Fatal(err)
			}
			if err := sb.Start(context.Background(), "/img/c1.ext4", "c1"); err != nil {
				t.Fatal(err)
			}
			defer sb.Stop(context.Background())
			if asked != c.asked || vmm.Config.Template != c.want {
				t.Fatalf("TemplateFor asked %v (want %v), VM template %q (want %q)", asked, c.asked, vmm.Config.Template, c.want)
			}
			if asked && askedNICs != c.nics {
				t.Errorf("TemplateFor asked for %d NICs, want %d", askedNICs, c.nics)
			}
			restored := c.want != ""
			if got := agent.CallCount("Freshen") == 1; got != restored {
				t.Errorf("guest clock and RNG freshened: %v, want %v", got, restored)
			}
			// Both have the rootfs in slot 0 before the guest runs: a
			// cold-booted VM boots with it; a restored one has the
			// sandbox's stubs in every slot as they are (no copies of the
			// template's) and slot 0 re-pointed at the rootfs while parked.
			if slot0 := vmm.Config.Disks[0].Path; slot0 != "/img/c1.ext4" {
				t.Errorf("slot 0 starts with %s (restored %v)", slot0, restored)
			}
			wantUses := 0
			if restored {
				wantUses = 2
			}
			if len(vmm.Config.DiskUses) != wantUses || restored && (filepath.Base(vmm.Config.DiskUses["cube-slot-1"]) != "slot-1.img" ||
				filepath.Base(vmm.Config.DiskUses["cube-slot-0"]) != "slot-0.img" || vmm.Config.DiskSets["cube-slot-0"] != "/img/c1.ext4" ||
				len(vmm.Config.DiskSets) != 1) {
				t.Errorf("restored %v: disk uses %v, disk sets %v", restored, vmm.Config.DiskUses, vmm.Config.DiskSets)
			}
			// A restored VM mounted the rootfs in the call that stepped its
			// clock (Freshen, freshenAndMount); AttachRootfs finds it
			// mounted. A cold-booted one mounts it in AttachRootfs.
			if got := len(agent.Mounts()) == 1; got != restored {
				t.Errorf("rootfs mounted during the start: %v, want %v", got, restored)
			}
			if mp, err := sb.AttachRootfs(context.Background(), "c1", "/img/c1.ext4"); err != nil || mp == "" {
				t.Fatalf("attach rootfs: %q, %v", mp, err)
			}
			if n, want := agent.CallCount("MountDisk"), map[bool]int{true: 0, false: 1}[restored]; n != want || len(agent.Mounts()) != 1 {
				t.Errorf("MountDisk called %d times (want %d), %d disks mounted (want 1)", n, want, len(agent.Mounts()))
			}
			if n := vmm.SetDiskCount(); n != 0 {
				t.Errorf("%d disk-set ops after the start", n)
			}
			if c.network == "" {
				return
			}
			// The network's tap is the VM's either way; from a template it
			// replaces the template's NIC, and the guest interface is found
			// by the template's MAC.
			fromNICTemplate := c.network == "counted" && restored
			if len(vmm.Config.Nets) != 1 || vmm.Config.Nets[0].Tap == nil || vmm.Config.ReplaceNets != fromNICTemplate {
				t.Errorf("VM nets %+v replace %v, want one tap (replace %v)", vmm.Config.Nets, vmm.Config.ReplaceNets, fromNICTemplate)
			}
			nets := agent.Networks()
			if len(nets) != 1 || len(nets[0].Interfaces) != 1 {
				t.Fatalf("guest network configurations %+v", nets)
			}
			want := ""
			if fromNICTemplate {
				want = tmplMAC
			}
			if in := nets[0].Interfaces[0]; in.DeviceMAC != want || in.MAC != "02:42:0a:58:00:05" {
				t.Errorf("guest interface mac %s device mac %q, want 02:42:0a:58:00:05 and %q", in.MAC, in.DeviceMAC, want)
			}
		})
	}
}

// TestTemplateNICsMismatch: a network that attaches another number of NICs
// than its NICCount said fails the start (the template's devices cannot
// change), and nothing stays attached.
func TestTemplateNICsMismatch(t *testing.T) {
	agent := sandboxtest.NewAgent()
	vmm := sandboxtest.NewVMM(agent)
	n := &fakeNetwork{}
	sb, err := sandbox.New(sandbox.Options{ID: "sb1", Dir: filepath.Join(t.TempDir(), "sb"), DiskSlots: 1,
		VMM: vmm, Dial: sandboxtest.Dialer(agent), BootTimeout: time.Second, Network: twoNICs{n},
		TemplateFor: func(context.Context, int) (sandbox.TemplateVM, error) {
			return sandbox.TemplateVM{Dir: "/tmpl/abc/vm", NICMACs: []string{tmplMAC, "02:cb:00:00:00:02"}}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Start(context.Background(), "/img/c1.ext4", "c1"); err == nil {
		sb.Stop(context.Background())
		t.Fatal("a network attaching 1 NIC started from a template with 2")
	}
	if calls := n.log(); len(calls) != 2 || calls[1] != "Detach" {
		t.Errorf("network calls %v, want Attach then Detach", calls)
	}
}

type twoNICs struct{ *fakeNetwork }

func (twoNICs) NICCount() int { return 2 }

// A template restore whose agent predates Freshen (an initrd of an older
// release) makes the three calls instead: clock, RNG and the rootfs mount.
func TestTemplateRestoreOlderAgent(t *testing.T) {
	agent := sandboxtest.NewAgent()
	agent.FreshenErr = fmt.Errorf("older agent: %w", errdefs.ErrNotImplemented)
	vmm := sandboxtest.NewVMM(agent)
	sb, err := sandbox.New(sandbox.Options{ID: "sb1", Dir: filepath.Join(t.TempDir(), "sb"), DiskSlots: 2,
		VMM: vmm, Dial: sandboxtest.Dialer(agent), BootTimeout: time.Second,
		TemplateFor: func(context.Context, int) (sandbox.TemplateVM, error) {
			return sandbox.TemplateVM{Dir: "/tmpl/abc/vm"}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Start(context.Background(), "/img/c1.ext4", "c1"); err != nil {
		t.Fatal(err)
	}
	defer sb.Stop(context.Background())
	for _, c := range []string{"Freshen", "SetTime", "ReseedRandom", "MountDisk"} {
		if n := agent.CallCount(c); n != 1 {
			t.Errorf("%s called %d times, want once: %v", c, n, agent.CallLog())
		}
	}
	if mp, err := sb.AttachRootfs(context.Background(), "c1", "/img/c1.ext4"); err != nil || mp == "" || agent.CallCount("MountDisk") != 1 {
		t.Fatalf("attach rootfs: %q, %v; MountDisk calls %d, want the one of the start", mp, err, agent.CallCount("MountDisk"))
	}
}
