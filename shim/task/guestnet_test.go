package task

import (
	"context"
	"encoding/json"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestGuestSpecPodNetwork: with a NIC from the host, CNI's namespace path is
// dropped (the sandbox container stays in the guest's initial namespace,
// where the agent configured the NIC) and a pod member's /proc/<VMM pid>
// path still becomes the sandbox container's guest namespace; without one,
// the sandbox container gets a fresh namespace (path emptied, entry kept).
func TestGuestSpecPodNetwork(t *testing.T) {
	spec := func(netns string) []byte {
		b, _ := json.Marshal(specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
			{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace, Path: netns}}}})
		return b
	}
	namespaces := func(raw []byte) []specs.LinuxNamespace {
		var s specs.Spec
		if err := json.Unmarshal(raw, &s); err != nil {
			t.Fatal(err)
		}
		return s.Linux.Namespaces
	}
	out, err := guestSpec(context.Background(), spec("/var/run/netns/cni-1"), specEnv{containerID: "pause", vmmPid: 42, guestNetwork: true})
	if err != nil {
		t.Fatal(err)
	}
	if ns := namespaces(out); len(ns) != 1 || ns[0].Type != specs.PIDNamespace {
		t.Errorf("sandbox container with a NIC: namespaces %+v, want the network one dropped", ns)
	}
	out, err = guestSpec(context.Background(), spec("/proc/42/ns/net"), specEnv{containerID: "c1", vmmPid: 42, sandboxGuestPid: 7, guestNetwork: true})
	if err != nil {
		t.Fatal(err)
	}
	if ns := namespaces(out); len(ns) != 2 || ns[1].Path != "/proc/7/ns/net" {
		t.Errorf("pod member with a NIC: namespaces %+v, want the sandbox container's guest netns", ns)
	}
	out, err = guestSpec(context.Background(), spec("/var/run/netns/cni-1"), specEnv{containerID: "pause", vmmPid: 42})
	if err != nil {
		t.Fatal(err)
	}
	if ns := namespaces(out); len(ns) != 2 || ns[1].Type != specs.NetworkNamespace || ns[1].Path != "" {
		t.Errorf("sandbox container without a NIC: namespaces %+v, want a fresh network namespace", ns)
	}
	// A new namespace (ctr/nerdctl with network hooks): with a NIC it is the guest's; without, it stays new.
	out, err = guestSpec(context.Background(), spec(""), specEnv{containerID: "c1", vmmPid: 42, guestNetwork: true})
	if err != nil {
		t.Fatal(err)
	}
	if ns := namespaces(out); len(ns) != 1 || ns[0].Type != specs.PIDNamespace {
		t.Errorf("hook-networked container: namespaces %+v, want the network one dropped (the guest's, with the NIC)", ns)
	}
	out, err = guestSpec(context.Background(), spec(""), specEnv{containerID: "c1", vmmPid: 42})
	if err != nil {
		t.Fatal(err)
	}
	if ns := namespaces(out); len(ns) != 2 || ns[1].Type != specs.NetworkNamespace || ns[1].Path != "" {
		t.Errorf("container without a NIC: namespaces %+v, want its own new network namespace", ns)
	}
}
