package sandbox_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/sandbox/sandboxtest"
	"github.com/cube-runtime/cube/shim/standby"
)

// adoptingVMM is the fake VMM with sandbox.Adopter: Adopt takes the
// standby's place as Start would (AdoptErr refuses it), and standbys are
// started with Binary.
type adoptingVMM struct {
	*sandboxtest.VMM
	Binary   string
	AdoptErr error
	Adopted  *standby.Standby
}

func (v *adoptingVMM) Adopt(ctx context.Context, cfg sandbox.VMConfig, sb standby.Standby) error {
	if v.AdoptErr != nil {
		return v.AdoptErr
	}
	v.Adopted = &sb
	return v.VMM.Start(ctx, cfg)
}

func (v *adoptingVMM) VMMBinary() string { return v.Binary }

// sleepScript is a stand-in for cube-vmm: it lives until killed.
func sleepScript(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "fake-vmm")
	if err := os.WriteFile(p, []byte("#!/bin/sh\nexec sleep 600\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// freeStandby publishes a standby of template in stateDir whose "VMM" is a
// sleep process.
func freeStandby(t *testing.T, stateDir, template string) (string, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	st, err := standby.StartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(stateDir, standby.DirPrefix+"0123456789abcdef")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := standby.Write(dir, standby.Record{Template: template, Pid: cmd.Process.Pid, StartTime: st, Slots: 2, Made: time.Now()}); err != nil {
		t.Fatal(err)
	}
	return dir, cmd
}

func standbyOptions(t *testing.T, stateDir string, vmm sandbox.VMM, agent *sandboxtest.Agent) sandbox.Options {
	return sandbox.Options{ID: "sb1", Dir: filepath.Join(stateDir, "ownsandboxdir00"), DiskSlots: 2, Standby: true,
		VMM: vmm, Dial: sandboxtest.Dialer(agent), BootTimeout: 5 * time.Second,
		TemplateFor: func(context.Context, int) (sandbox.TemplateVM, error) {
			return sandbox.TemplateVM{Dir: "/tmpl/abc/vm"}, nil
		}}
}

// TestStandbyAdoptedAndLeft: a sandbox restored from a template adopts the
// free standby of that template (its directory becomes the sandbox's state
// dir, the rootfs goes into slot 0 through disk-set), and leaves a new one
// for the next sandbox: started with the VMM binary, published with the
// template, its stubs in its directory.
func TestStandbyAdoptedAndLeft(t *testing.T) {
	state := t.TempDir()
	sbDir, _ := freeStandby(t, state, "/tmpl/abc/vm")
	agent := sandboxtest.NewAgent()
	vmm := &adoptingVMM{VMM: sandboxtest.NewVMM(agent), Binary: sleepScript(t)}
	s, err := sandbox.New(standbyOptions(t, state, vmm, agent))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background(), "/img/c1.ext4", "c1"); err != nil {
		t.Fatal(err)
	}
	if vmm.Adopted == nil || vmm.Adopted.Dir != sbDir || s.Dir() != sbDir {
		t.Fatalf("adopted %+v, sandbox dir %s; want the standby %s", vmm.Adopted, s.Dir(), sbDir)
	}
	if vmm.Config.DiskSets != nil || vmm.Config.ControlPath != filepath.Join(sbDir, "control.sock") {
		t.Errorf("adopted with %+v: want the standby's sockets and no -disk-set", vmm.Config)
	}
	if n := vmm.SetDiskCount(); n != 1 || vmm.Disks[sandbox.SlotSerial(0)] != "/img/c1.ext4" {
		t.Errorf("slot 0 after %d disk-sets: %q, want the rootfs", n, vmm.Disks[sandbox.SlotSerial(0)])
	}
	if _, err := os.Stat(filepath.Join(sbDir, standby.ClaimedName)); err != nil {
		t.Errorf("the adopted standby's record: %v", err)
	}

	// The standby left for the next sandbox appears in the background.
	var left []standby.Standby
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if left, err = standby.List(state); err != nil {
			t.Fatal(err)
		}
		if len(left) > 0 {
			break
		}
	}
	if len(left) != 1 || left[0].Record.Template != "/tmpl/abc/vm" || left[0].Record.Slots != 2 {
		t.Fatalf("standbys left: %+v, want one of /tmpl/abc/vm", left)
	}
	for _, f := range []string{"slot-0.img", "slot-1.img"} {
		if _, err := os.Stat(filepath.Join(left[0].Dir, f)); err != nil {
			t.Errorf("new standby: %v", err)
		}
	}
	if n, err := standby.Stop(state, ""); err != nil || n != 1 {
		t.Errorf("Stop = %d, %v", n, err)
	}
	s.Stop(context.Background())
	if _, err := os.Stat(sbDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the adopted standby's dir outlived its sandbox: %v", err)
	}
}

// TestStandbyRefusedFallsBack: a standby that cannot be adopted is ended
// (its VMM killed, its directory removed) and the sandbox restores its own
// VM in its own state dir.
func TestStandbyRefusedFallsBack(t *testing.T) {
	state := t.TempDir()
	sbDir, proc := freeStandby(t, state, "/tmpl/abc/vm")
	agent := sandboxtest.NewAgent()
	vmm := &adoptingVMM{VMM: sandboxtest.NewVMM(agent), AdoptErr: errors.New("its sockets never appeared")}
	o := standbyOptions(t, state, vmm, agent)
	s, err := sandbox.New(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background(), "/img/c1.ext4", "c1"); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(context.Background())
	if s.Dir() != o.Dir || vmm.Config.Template != "/tmpl/abc/vm" || vmm.Config.DiskSets[sandbox.SlotSerial(0)] != "/img/c1.ext4" {
		t.Fatalf("dir %s, config %+v: want a restore of the template in %s", s.Dir(), vmm.Config, o.Dir)
	}
	if err := proc.Wait(); err == nil {
		t.Error("the refused standby's VMM was not killed")
	}
	if _, err := os.Stat(sbDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused standby's dir: %v", err)
	}
}

// TestStandbyNotForNetworkedOrOff: no standby is adopted or left by a
// sandbox with a network, or with Standby off.
func TestStandbyNotForNetworkedOrOff(t *testing.T) {
	for _, name := range []string{"network", "off"} {
		t.Run(name, func(t *testing.T) {
			state := t.TempDir()
			sbDir, _ := freeStandby(t, state, "/tmpl/abc/vm")
			agent := sandboxtest.NewAgent()
			vmm := &adoptingVMM{VMM: sandboxtest.NewVMM(agent), Binary: sleepScript(t)}
			o := standbyOptions(t, state, vmm, agent)
			if name == "network" {
				o.Network = nicNetwork{&fakeNetwork{}}
				o.TemplateFor = func(context.Context, int) (sandbox.TemplateVM, error) {
					return sandbox.TemplateVM{Dir: "/tmpl/abc/vm", NICMACs: []string{tmplMAC}}, nil
				}
			} else {
				o.Standby = false
			}
			s, err := sandbox.New(o)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Start(context.Background(), "/img/c1.ext4", "c1"); err != nil {
				t.Fatal(err)
			}
			defer s.Stop(context.Background())
			time.Sleep(100 * time.Millisecond) // a standby would be started by now
			if vmm.Adopted != nil || s.Dir() != o.Dir {
				t.Errorf("adopted %+v", vmm.Adopted)
			}
			l, err := standby.List(state)
			if err != nil || len(l) != 1 || l[0].Dir != sbDir {
				t.Errorf("standbys %+v, %v: want only the one there before", l, err)
			}
		})
	}
}
