package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/cube-runtime/cube"

// shimHypervisorDeps are the only packages under hypervisor/ the shim may
// link: the VMM's control client, the hybrid-vsock dial, and the VM snapshot
// format (a restore from a checkpoint reads its manifest to refuse another
// VMM version, kernel or CPU before starting a VMM). All are leaves that
// import nothing of ours; anything else there (hypervisor/pci,
// hypervisor/virtio/..., devices, KVM, the machine) is device emulation or
// the VMM itself, which runs in the cube-vmm process, not in the shim.
var shimHypervisorDeps = map[string]bool{
	module + "/hypervisor/control":   true,
	module + "/hypervisor/vsockdial": true,
	module + "/hypervisor/snapshot":  true,
}

// TestShimLinksNoDeviceEmulation asserts the layering docs/shim.md and the
// architecture brief state: the shim drives cube-vmm through its control
// socket and reaches the guest over the hybrid vsock socket, and links
// neither hypervisor/pci nor hypervisor/virtio (nor anything under them),
// nor anything of checkpoint/ (the snapshot store is its callers').
func TestShimLinksNoDeviceEmulation(t *testing.T) {
	goBin, err := exec.LookPath("go") // go test puts GOROOT/bin first in PATH
	if err != nil {
		t.Skipf("no go command to list the shim's dependencies: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list -deps: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	seen := map[string]bool{}
	for _, p := range deps {
		seen[p] = true
		rel, ours := strings.CutPrefix(p, module+"/")
		if !ours {
			continue
		}
		switch {
		case under(rel, "hypervisor/pci"), under(rel, "hypervisor/virtio"):
			t.Errorf("the shim links %s (device emulation); see `go list -deps ./cmd/containerd-shim-cube-v1`", p)
		case under(rel, "hypervisor") && !shimHypervisorDeps[p]:
			t.Errorf("the shim links %s; of hypervisor/ it may use only %v", p, keys(shimHypervisorDeps))
		case under(rel, "checkpoint"):
			// checkpoint/ (the snapshot store, the CLI) is the layer above
			// the shim: it calls the shim's snapshot service, never the reverse.
			t.Errorf("the shim links %s: checkpoint/ is the layer above the shim", p)
		}
	}
	// The list is the real one: the shim's own packages (its snapshot service
	// too) and its control client are in it.
	for _, want := range []string{module + "/shim/sandbox", module + "/shim/snapshotsvc", module + "/hypervisor/control"} {
		if !seen[want] {
			t.Errorf("go list -deps lacks %s; got:\n%s", want, out)
		}
	}
}

// under reports whether package path rel is dir or inside it.
func under(rel, dir string) bool { return rel == dir || strings.HasPrefix(rel, dir+"/") }

func keys(m map[string]bool) []string {
	var ks []string
	for k := range m {
		ks = append(ks, strings.TrimPrefix(k, module+"/"))
	}
	slices.Sort(ks)
	return ks
}
