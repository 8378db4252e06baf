package sandbox_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/sandbox/sandboxtest"
)

// TestChooseTemplate: Start restores from TemplateFor's template when one
// can serve the sandbox (its stubs used as they are, the rootfs set in slot
// 0 before the guest runs, the guest's clock and RNG refreshed), and cold-boots without asking for one when the
// sandbox has a network or the config names a template, or when
// TemplateFor fails.
func TestChooseTemplate(t *testing.T) {
	cases := []struct {
		name     string
		network  bool
		explicit string
		err      error
		asked    bool
		want     string
	}{
		{name: "template", asked: true, want: "/tmpl/abc/vm"},
		{name: "no template: cold boot", err: errors.New("build failed"), asked: true, want: ""},
		{name: "network: cold boot", network: true, asked: false, want: ""},
		{name: "explicit template wins", explicit: "/mine", asked: false, want: "/mine"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			agent := sandboxtest.NewAgent()
			vmm := sandboxtest.NewVMM(agent)
			asked := false
			o := sandbox.Options{ID: "sb1", Dir: filepath.Join(t.TempDir(), "sb"), DiskSlots: 2, Template: c.explicit,
				VMM: vmm, Dial: sandboxtest.Dialer(agent), BootTimeout: time.Second,
				TemplateFor: func(context.Context) (string, error) { asked = true; return "/tmpl/abc/vm", c.err }}
			if c.network {
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
			restored := c.want != ""
			if got := agent.CallCount("ReseedRandom") == 1; got != restored {
				t.Errorf("guest RNG reseeded: %v, want %v", got, restored)
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
			// A restored VM mounted the rootfs while its clock was stepped
			// (freshenAndMount); AttachRootfs finds it mounted.
			if got := agent.CallCount("MountDisk") == 1; got != restored {
				t.Errorf("rootfs mounted during the start: %v, want %v", got, restored)
			}
			if mp, err := sb.AttachRootfs(context.Background(), "c1", "/img/c1.ext4"); err != nil || mp == "" {
				t.Fatalf("attach rootfs: %q, %v", mp, err)
			}
			if n := agent.CallCount("MountDisk"); n != 1 {
				t.Errorf("MountDisk called %d times, want once", n)
			}
			if n := vmm.SetDiskCount(); n != 0 {
				t.Errorf("%d disk-set ops after the start", n)
			}
		})
	}
}
