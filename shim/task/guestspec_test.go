package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/shim/sandbox/sandboxtest"
	"github.com/cube-runtime/cube/shim/volume"
)

// testEnv is a specEnv on a fake agent, with a Syncer pushing into it.
func testEnv(t *testing.T, id string) (specEnv, *sandboxtest.Agent) {
	a := sandboxtest.NewAgent()
	syncer := volume.NewSyncer(volume.SyncerOptions{Agent: func() volume.Agent { return a }, Interval: 10 * time.Millisecond})
	t.Cleanup(syncer.Close)
	return specEnv{containerID: id, vmmPid: 4242, agent: a, volumes: syncer, use: &volumeUse{}}, a
}

// A CRI pod member's spec, as containerd 2.4 writes it (host network: no
// uts or net namespace), plus an unknown field that must pass through.
func criSpec(t *testing.T, sandboxDir string, vmmPid int) []byte {
	t.Helper()
	for name, content := range map[string]string{"hosts": "127.0.0.1 localhost\n", "hostname": "pod\n", "resolv.conf": "nameserver 10.0.0.1\n"} {
		if err := os.WriteFile(filepath.Join(sandboxDir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	shm := filepath.Join(sandboxDir, "shm")
	os.Mkdir(shm, 0o700)
	spec := map[string]any{
		"ociVersion": "1.2.0",
		"process":    map[string]any{"args": []string{"sh"}, "cwd": "/"},
		"root":       map[string]any{"path": "/run/cube/disks/cube-slot-1"},
		"mounts": []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/etc/hosts", Type: "bind", Source: filepath.Join(sandboxDir, "hosts"), Options: []string{"rbind", "rprivate", "rw"}},
			{Destination: "/etc/hostname", Type: "bind", Source: filepath.Join(sandboxDir, "hostname"), Options: []string{"rbind", "rprivate", "rw"}},
			{Destination: "/etc/resolv.conf", Source: filepath.Join(sandboxDir, "resolv.conf"), Options: []string{"rbind", "ro"}},
			{Destination: "/dev/shm", Type: "bind", Source: shm, Options: []string{"rbind", "ro", "nosuid"}},
		},
		"linux": map[string]any{
			"namespaces": []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.IPCNamespace, Path: fmt.Sprintf("/proc/%d/ns/ipc", vmmPid)},
				{Type: specs.MountNamespace},
			},
			"cgroupsPath": "/k8s.io/abc",
		},
		"x-unknown": "kept",
	}
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestGuestSpecCRIPodMember(t *testing.T) {
	dir := t.TempDir()
	env, agent := testEnv(t, "app1")
	env.sandboxGuestPid = 77
	out, err := guestSpec(context.Background(), criSpec(t, dir, 4242), env)
	if err != nil {
		t.Fatal(err)
	}
	var got specs.Spec
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"/etc/hosts":       "/run/cube/files/app1/1-hosts",
		"/etc/hostname":    "/run/cube/files/app1/2-hostname",
		"/etc/resolv.conf": "/run/cube/files/app1/3-resolv.conf",
	}
	for _, m := range got.Mounts {
		if w, ok := want[m.Destination]; ok && m.Source != w {
			t.Errorf("%s bound from %s, want the guest copy %s", m.Destination, m.Source, w)
		}
		if m.Destination == "/dev/shm" && (m.Type != "tmpfs" || !strings.Contains(strings.Join(m.Options, ","), "ro")) {
			t.Errorf("/dev/shm: %+v, want a read-only tmpfs", m)
		}
		if m.Destination == "/proc" && (m.Type != "proc" || m.Source != "proc") {
			t.Errorf("/proc changed: %+v", m)
		}
	}
	if d, mode, _ := agent.File("/run/cube/files/app1/1-hosts"); string(d) != "127.0.0.1 localhost\n" || mode != 0o644 || len(env.use.synced) != 3 {
		t.Errorf("hosts copied into the guest: %q %o; synced %v", d, mode, env.use.synced)
	}
	if ns := got.Linux.Namespaces[1]; ns.Path != "/proc/77/ns/ipc" {
		t.Errorf("ipc namespace %q, want the sandbox container's guest pid", ns.Path)
	}
	if got.Linux.CgroupsPath != "/k8s.io/abc" || !strings.Contains(string(out), `"x-unknown":"kept"`) {
		t.Errorf("other fields not kept: %s", out)
	}
}

func TestGuestSpecRefusals(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	os.WriteFile(big, make([]byte, volume.MaxFile+1), 0o644)
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	base := func(mounts []specs.Mount, nss []specs.LinuxNamespace) []byte {
		b, _ := json.Marshal(map[string]any{"process": map[string]any{"args": []string{"x"}}, "mounts": mounts,
			"linux": map[string]any{"namespaces": nss}})
		return b
	}
	env, _ := testEnv(t, "c")
	for name, tc := range map[string]struct {
		spec []byte
		want error
		msg  string
	}{
		"host fifo":            {base([]specs.Mount{{Destination: "/data", Type: "bind", Source: fifo}}, nil), errdefs.ErrInvalidArgument, "cannot use host devices, sockets or fifos"},
		"missing source":       {base([]specs.Mount{{Destination: "/x", Options: []string{"rbind"}, Source: filepath.Join(dir, "nope")}}, nil), errdefs.ErrInvalidArgument, "no such file"},
		"large file":           {base([]specs.Mount{{Destination: "/x", Type: "bind", Source: big}}, nil), errdefs.ErrInvalidArgument, "more than"},
		"host ipc namespace":   {base(nil, []specs.LinuxNamespace{{Type: specs.IPCNamespace, Path: "/proc/1/ns/ipc"}}), errdefs.ErrInvalidArgument, "on the host"},
		"no sandbox container": {base(nil, []specs.LinuxNamespace{{Type: specs.IPCNamespace, Path: "/proc/4242/ns/ipc"}}), errdefs.ErrFailedPrecondition, "does not run"},
		"bad json":             {[]byte(`{"mounts": 7}`), errdefs.ErrInvalidArgument, "mounts"},
	} {
		_, err := guestSpec(context.Background(), tc.spec, env)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want %v with %q", name, err, tc.want, tc.msg)
		}
	}
	// A host network namespace (CNI's netns) is replaced by a new one.
	out, err := guestSpec(context.Background(), base(nil, []specs.LinuxNamespace{{Type: specs.NetworkNamespace, Path: "/var/run/netns/cni-1"}}), env)
	if err != nil || strings.Contains(string(out), "cni-1") {
		t.Errorf("host netns: %s %v", out, err)
	}
}
