package sandbox_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/sandbox/sandboxtest"
)

// fakeNetwork records the order of its calls among the VMM's and agent's.
type fakeNetwork struct {
	mu        sync.Mutex
	attachErr error
	calls     []string
	tap       *os.File
}

func (n *fakeNetwork) Attach(ctx context.Context) (sandbox.NetworkAttachment, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.calls = append(n.calls, "Attach")
	if n.attachErr != nil {
		return sandbox.NetworkAttachment{}, n.attachErr
	}
	r, w, _ := os.Pipe()
	w.Close()
	n.tap = r
	return sandbox.NetworkAttachment{
		NICs: []sandbox.NIC{{Tap: r, MAC: "02:42:0a:58:00:05"}},
		Guest: sandbox.NetworkConfig{Interfaces: []sandbox.NetInterface{{MAC: "02:42:0a:58:00:05", Addresses: []string{"10.88.0.5/16"},
			Routes: []sandbox.NetRoute{{Gateway: "10.88.0.1"}}}}, DNS: &sandbox.DNSConfig{Nameservers: []string{"10.96.0.10"}}},
	}, nil
}

func (n *fakeNetwork) Detach(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.calls = append(n.calls, "Detach")
	return nil
}

func (n *fakeNetwork) log() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.calls)
}

func newNetSandbox(t *testing.T, n *fakeNetwork, template string) (*sandbox.Sandbox, *sandboxtest.VMM, *sandboxtest.Agent) {
	agent := sandboxtest.NewAgent()
	vmm := sandboxtest.NewVMM(agent)
	sb, err := sandbox.New(sandbox.Options{ID: "sb1", Dir: filepath.Join(t.TempDir(), "sb"), DiskSlots: 1, Template: template,
		VMM: vmm, Dial: sandboxtest.Dialer(agent), BootTimeout: time.Second, Network: n})
	if err != nil {
		t.Fatal(err)
	}
	return sb, vmm, agent
}

// TestNetworkLifecycle: the network is attached before the VMM starts (its
// taps are in the VM config), configured in the guest before Start returns,
// the shim's tap copies are closed once the VMM has its own, and Detach runs
// when the VM is gone.
func TestNetworkLifecycle(t *testing.T) {
	n := &fakeNetwork{}
	sb, vmm, agent := newNetSandbox(t, n, "")
	if err := sb.Start(context.Background(), "/img/c1.ext4", "c1"); err != nil {
		t.Fatal(err)
	}
	if !sb.HasNetwork() {
		t.Error("HasNetwork false with a network")
	}
	if len(vmm.Config.Nets) != 1 || vmm.Config.Nets[0].MAC != "02:42:0a:58:00:05" {
		t.Errorf("VM config nets %+v", vmm.Config.Nets)
	}
	if _, err := n.tap.Stat(); err == nil {
		t.Error("the shim's copy of the tap fd is still open after the VMM started")
	}
	nets := agent.Networks()
	if len(nets) != 1 || nets[0].Interfaces[0].Addresses[0] != "10.88.0.5/16" || nets[0].DNS.Nameservers[0] != "10.96.0.10" {
		t.Errorf("agent got %+v", nets)
	}
	calls := agent.CallLog()
	if i := slices.Index(calls, "ConfigureNetwork"); i < 0 || slices.Contains(calls[:i], "CreateContainer") {
		t.Errorf("agent calls %v: ConfigureNetwork must come before any container", calls)
	}
	if got := n.log(); !slices.Equal(got, []string{"Attach"}) {
		t.Errorf("network calls while running: %v", got)
	}
	sb.Stop(context.Background())
	if got := n.log(); !slices.Equal(got, []string{"Attach", "Detach"}) {
		t.Errorf("network calls after Stop: %v", got)
	}
}

// TestNetworkFailures: an agent that cannot configure the network fails
// Start and everything is undone (Detach); a failed Attach starts no VMM; a
// template restore (its VM has no NIC) is refused naming the setting.
func TestNetworkFailures(t *testing.T) {
	n := &fakeNetwork{}
	sb, _, agent := newNetSandbox(t, n, "")
	agent.NetworkErr = errors.New("no interface with mac 02:42:0a:58:00:05")
	err := sb.Start(context.Background(), "/img/c1.ext4", "c1")
	if err == nil || !strings.Contains(err.Error(), "configure the guest's network") {
		t.Errorf("Start with a failing ConfigureNetwork: %v", err)
	}
	<-sb.Done()
	if got := n.log(); !slices.Equal(got, []string{"Attach", "Detach"}) {
		t.Errorf("network calls after a failed Start: %v", got)
	}

	n = &fakeNetwork{attachErr: errors.New("no CNI interface")}
	sb, vmm, _ := newNetSandbox(t, n, "")
	if err := sb.Start(context.Background(), "/img/c1.ext4", "c1"); err == nil || !strings.Contains(err.Error(), "no CNI interface") {
		t.Errorf("Start with a failing Attach: %v", err)
	}
	if vmm.Config.VsockPath != "" {
		t.Error("the VMM started although the network could not be attached")
	}

	n = &fakeNetwork{}
	sb, _, _ = newNetSandbox(t, n, "/templates/t1")
	if err := sb.Start(context.Background(), "/img/c1.ext4", "c1"); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "template") {
		t.Errorf("template + network: %v, want FailedPrecondition naming template", err)
	}
	if got := n.log(); slices.Contains(got, "Attach") {
		t.Errorf("template + network attached anyway: %v", got)
	}
}

func TestNetArgs(t *testing.T) {
	r, w, _ := os.Pipe()
	defer r.Close()
	defer w.Close()
	a := sandbox.Args(sandbox.VMConfig{Kernel: "k", Nets: []sandbox.NIC{{Tap: r, MAC: "02:42:0a:58:00:05"}, {Tap: w}}})
	s := strings.Join(a, " ")
	if !strings.Contains(s, "-net fd=3,mac=02:42:0a:58:00:05 -net fd=4 ") {
		t.Errorf("args %q", s)
	}
	// A template VM's NICs have no backend: fd 3+i stays unused.
	a = sandbox.Args(sandbox.VMConfig{Kernel: "k", Nets: []sandbox.NIC{{NoBackend: true, MAC: sandbox.TemplateNICMAC(0)}}})
	if s := strings.Join(a, " "); !strings.Contains(s, "-net none,mac=02:cb:00:00:00:01 ") {
		t.Errorf("args %q", s)
	}
	vmm := &sandbox.ProcessVMM{Binary: "/nonexistent/cube-vmm"}
	if err := vmm.Start(context.Background(), sandbox.VMConfig{Kernel: "k", Nets: []sandbox.NIC{{Tap: r, NoBackend: true}}}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a NIC with a tap and no backend: %v, want InvalidArgument", err)
	}
}

// TestRestoreWithNetwork: a restore's NICs replace its snapshot's, one for
// one: the VMM gets them (ReplaceNets), the agent finds each guest interface
// by the snapshot's MAC and moves it to the new MAC and address. A count
// that differs either way is refused before the VMM starts, and undone.
func TestRestoreWithNetwork(t *testing.T) {
	restore := func(n *fakeNetwork, macs []string) (*sandbox.Sandbox, *sandboxtest.VMM, *sandboxtest.Agent, error) {
		agent := sandboxtest.NewAgent()
		vmm := sandboxtest.NewVMM(agent)
		o := sandbox.Options{ID: "sb1", Dir: filepath.Join(t.TempDir(), "sb"), DiskSlots: 1,
			VMM: vmm, Dial: sandboxtest.Dialer(agent), BootTimeout: time.Second}
		if n != nil {
			o.Network = n
		}
		sb, err := sandbox.New(o)
		if err != nil {
			t.Fatal(err)
		}
		err = sb.StartRestore(context.Background(), sandbox.RestoreFrom{Dir: "/ckpt/vm", Slots: 1, RootfsSerial: "cube-slot-0",
			RootfsImage: "/img/new.ext4", Owner: "c2", NICMACs: macs})
		return sb, vmm, agent, err
	}
	n := &fakeNetwork{}
	sb, vmm, agent, err := restore(n, []string{"02:42:0a:58:00:99"})
	if err != nil {
		t.Fatal(err)
	}
	if !vmm.Config.ReplaceNets || len(vmm.Config.Nets) != 1 || vmm.Config.Template != "/ckpt/vm" {
		t.Errorf("VM config: replace %v nets %+v template %q", vmm.Config.ReplaceNets, vmm.Config.Nets, vmm.Config.Template)
	}
	nets := agent.Networks()
	if len(nets) != 1 || nets[0].Interfaces[0].DeviceMAC != "02:42:0a:58:00:99" || nets[0].Interfaces[0].MAC != "02:42:0a:58:00:05" ||
		nets[0].Interfaces[0].Addresses[0] != "10.88.0.5/16" {
		t.Errorf("agent got %+v", nets)
	}
	calls := agent.CallLog()
	if i, j := slices.Index(calls, "Freshen"), slices.Index(calls, "ConfigureNetwork"); i < 0 || j < i {
		t.Errorf("agent calls %v: the network is configured after the restored guest is freshened", calls)
	}
	sb.Stop(context.Background())

	// The snapshot had a NIC, the new container has no network.
	if _, vmm, _, err := restore(nil, []string{"02:42:0a:58:00:99"}); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "had 1 network devices") {
		t.Errorf("lost NIC: %v", err)
	} else if vmm.Config.VsockPath != "" {
		t.Error("the VMM started for a restore that loses a NIC")
	}
	// The snapshot had none, the new container has a network: attached, then undone.
	n = &fakeNetwork{}
	if _, vmm, _, err := restore(n, nil); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "gives 1") {
		t.Errorf("added NIC: %v", err)
	} else if vmm.Config.VsockPath != "" {
		t.Error("the VMM started for a restore that adds a NIC")
	}
	if got := n.log(); !slices.Equal(got, []string{"Attach", "Detach"}) {
		t.Errorf("network calls after a refused restore: %v", got)
	}
	if _, err := n.tap.Stat(); err == nil {
		t.Error("the tap of a refused restore is still open")
	}
}
