package task

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestPodMemberSpecReachesTheGuestTranslated: through Create, a CRI pod
// member's spec arrives at the agent with the pause container's guest pid in
// its namespace paths and its host files copied into the guest.
func TestPodMemberSpecReachesTheGuestTranslated(t *testing.T) {
	h := newHarness(t)
	pod := map[string]string{SandboxIDAnnotation: "pod1"}
	h.create("pod1", []string{"sleep"}, nil, pod)
	h.start("pod1", "")
	pids, err := h.svc.Pids(h.ctx, &taskAPI.PidsRequest{ID: "pod1"})
	if err != nil || len(pids.Processes) == 0 {
		t.Fatalf("pause container's guest pids: %v %v", pids, err)
	}
	pauseGuest := pids.Processes[0].Pid
	vmmPid := h.vmm.Pid()

	hosts := filepath.Join(t.TempDir(), "hosts")
	os.WriteFile(hosts, []byte("127.0.0.1 pod\n"), 0o644)
	dir := filepath.Join(t.TempDir(), "app1")
	os.MkdirAll(dir, 0o755)
	spec := specs.Spec{Version: specs.Version, Process: &specs.Process{Args: []string{"sleep"}, Cwd: "/"},
		Root: &specs.Root{Path: "rootfs"}, Annotations: pod,
		Mounts: []specs.Mount{{Destination: "/etc/hosts", Type: "bind", Source: hosts, Options: []string{"rbind", "ro"}}},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
			{Type: specs.MountNamespace}, {Type: specs.IPCNamespace, Path: fmt.Sprintf("/proc/%d/ns/ipc", vmmPid)}}}}
	b, _ := json.Marshal(spec)
	os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644)
	if _, err := h.svc.Create(h.ctx, &taskAPI.CreateTaskRequest{ID: "app1", Bundle: dir, Rootfs: rootfs("/images/app1.ext4")}); err != nil {
		t.Fatal(err)
	}
	var got specs.Spec
	if err := json.Unmarshal(h.agent.Spec("app1"), &got); err != nil {
		t.Fatal(err)
	}
	if p := got.Linux.Namespaces[1].Path; p != fmt.Sprintf("/proc/%d/ns/ipc", pauseGuest) {
		t.Errorf("ipc namespace %q, want the pause container's guest pid %d (VMM pid %d)", p, pauseGuest, vmmPid)
	}
	src := got.Mounts[0].Source
	if data, _, ok := h.agent.File(src); !ok || string(data) != "127.0.0.1 pod\n" {
		t.Errorf("/etc/hosts bound from %s, guest file %q (written: %v)", src, data, ok)
	}
}
