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
}
