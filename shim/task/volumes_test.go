package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/sandbox/sandboxtest"
	"github.com/cube-runtime/cube/shim/volume/volumetest"
)

// kubeletPod lays out a pod directory as the kubelet does and returns its
// volume paths by name.
type kubeletPod struct{ root, uid string }

func newKubeletPod(t *testing.T) kubeletPod {
	return kubeletPod{root: filepath.Join(t.TempDir(), "kubelet"), uid: "6d1f7a0c-3b1e-4c55-9a0e-0c1e2f3a4b5c"}
}

func (p kubeletPod) volume(t *testing.T, plugin, name string) string {
	d := filepath.Join(p.root, "pods", p.uid, "volumes", "kubernetes.io~"+plugin, name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

func (p kubeletPod) termLog(t *testing.T, container string) string {
	d := filepath.Join(p.root, "pods", p.uid, "containers", container)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(d, "3f2a9b7c")
	if err := os.WriteFile(f, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	return f
}

func bindRO(dst, src string) specs.Mount {
	return specs.Mount{Destination: dst, Type: "bind", Source: src, Options: []string{"rbind", "rprivate", "ro"}}
}

func bindRW(dst, src string) specs.Mount {
	return specs.Mount{Destination: dst, Type: "bind", Source: src, Options: []string{"rbind", "rprivate", "rw"}}
}

// guestSource returns the source the guest spec of container id binds at dst.
func guestSource(t *testing.T, a *sandboxtest.Agent, id, dst string) string {
	t.Helper()
	var spec specs.Spec
	if err := json.Unmarshal(a.Spec(id), &spec); err != nil {
		t.Fatal(err)
	}
	for _, m := range spec.Mounts {
		if m.Destination == dst {
			return m.Source
		}
	}
	t.Fatalf("%s: no mount at %s", id, dst)
	return ""
}

// guestValue reads key through "..data" in the tree the agent holds at dir.
func guestValue(a *sandboxtest.Agent, dir, key string) string {
	tr, _ := a.Tree(dir)
	links, files := map[string]string{}, map[string]string{}
	for _, e := range tr.Entries {
		if e.Kind == sandbox.TreeSymlink {
			links[e.Path] = e.Target
		} else if e.Kind == sandbox.TreeFile {
			files[e.Path] = string(e.Data)
		}
	}
	if links[key] != "..data/"+key {
		return ""
	}
	return files[links["..data"]+"/"+key]
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (h *harness) createWithMounts(id string, args []string, ann map[string]string, mounts []specs.Mount) error {
	dir := filepath.Join(h.t.TempDir(), id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		h.t.Fatal(err)
	}
	spec := specs.Spec{Version: specs.Version, Process: &specs.Process{Args: args, Cwd: "/"},
		Root: &specs.Root{Path: "rootfs"}, Annotations: ann, Mounts: mounts}
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		h.t.Fatal(err)
	}
	_, err := h.svc.Create(h.ctx, &taskAPI.CreateTaskRequest{ID: id, Bundle: dir, Rootfs: rootfs("/images/" + id + ".ext4")})
	return err
}

// A pod as the kubelet makes it: an emptyDir shared by two containers on
// the sandbox's disk, a configMap copied in and following the host's swaps
// (and pushed again after a rollback), a termination log copied back at
// exit, and the syncing released with the last container that mounts it.
func TestPodVolumes(t *testing.T) {
	h := newHarness(t)
	h.svc.o.VolumeSyncInterval = 10 * time.Millisecond
	pod := newKubeletPod(t)
	cfg := pod.volume(t, "configmap", "cfg")
	if err := volumetest.WriteAtomic(cfg, map[string]string{"mode": "v1"}); err != nil {
		t.Fatal(err)
	}
	cache := pod.volume(t, "empty-dir", "cache")
	if err := os.Chmod(cache, 0o777); err != nil {
		t.Fatal(err)
	}
	tlog := pod.termLog(t, "app1")
	ann := map[string]string{SandboxIDAnnotation: "pod1"}
	h.create("pod1", []string{"sleep"}, nil, ann)
	h.start("pod1", "")
	if err := h.createWithMounts("app1", []string{"sleep"}, ann, []specs.Mount{
		bindRO("/etc/cfg", cfg), bindRW("/cache", cache), bindRW("/dev/termination-log", tlog)}); err != nil {
		t.Fatal(err)
	}
	h.start("app1", "")
	if err := h.createWithMounts("app2", []string{"sleep"}, ann, []specs.Mount{bindRO("/etc/cfg", cfg), bindRW("/data", cache)}); err != nil {
		t.Fatal(err)
	}
	h.start("app2", "")

	podRoot := h.agent.Mounts()
	var sandboxMount string
	for mp, serial := range podRoot {
		if serial == "cube-slot-0" {
			sandboxMount = mp
		}
	}
	wantCache := filepath.Join(sandboxMount, ".cube-volumes/empty-dir/cache")
	if a, b := guestSource(t, h.agent, "app1", "/cache"), guestSource(t, h.agent, "app2", "/data"); a != wantCache || b != wantCache {
		t.Fatalf("emptyDir bound from %s and %s, want both from %s on the sandbox's disk", a, b, wantCache)
	}
	if vs := h.agent.Volumes(); len(vs) != 2 || vs[0].Path != wantCache || vs[0].Tmpfs || vs[0].Mode != 0o777 {
		t.Fatalf("PrepareVolume requests: %+v", vs)
	}
	const guestCfg = "/run/cube/volumes/configmap/cfg"
	if a, b := guestSource(t, h.agent, "app1", "/etc/cfg"), guestSource(t, h.agent, "app2", "/etc/cfg"); a != guestCfg || b != guestCfg {
		t.Fatalf("configMap bound from %s and %s, want %s", a, b, guestCfg)
	}
	if v := guestValue(h.agent, guestCfg, "mode"); v != "v1" {
		t.Fatalf("guest configMap has %q at create", v)
	}
	if err := volumetest.WriteAtomic(cfg, map[string]string{"mode": "v2"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the configMap update in the guest", func() bool { return guestValue(h.agent, guestCfg, "mode") == "v2" })

	// Rollback: the guest's copy is the snapshot's (v2), the host has v3 by
	// then: the shim pushes v3 again.
	sb, err := h.svc.SandboxOf("app1")
	if err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(t.TempDir(), "s1")
	if _, err := sb.Snapshot(h.ctx, sandbox.SnapshotOptions{Dir: snap}); err != nil {
		t.Fatal(err)
	}
	if err := volumetest.WriteAtomic(cfg, map[string]string{"mode": "v3"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "v3 in the guest", func() bool { return guestValue(h.agent, guestCfg, "mode") == "v3" })
	pushes := h.agent.CallCount("SyncTree")
	if _, err := h.svc.RollbackSandbox(h.ctx, "app1", snap, "test"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "v3 pushed again after the rollback", func() bool {
		return h.agent.CallCount("SyncTree") > pushes && guestValue(h.agent, guestCfg, "mode") == "v3"
	})

	// The container writes its termination message; the kubelet finds it
	// in the host file once the exit is known.
	guestLog := guestSource(t, h.agent, "app1", "/dev/termination-log")
	if err := h.agent.WriteFile(h.ctx, guestLog, []byte("bye"), 0o666); err != nil {
		t.Fatal(err)
	}
	h.kill("app1", "", 9)
	h.wait("app1", "")
	if b, _ := os.ReadFile(tlog); string(b) != "bye" {
		t.Fatalf("host termination log %q after the exit, want bye", b)
	}
	h.delete("app1", "")
	if items := h.svc.volumes.Items(); len(items) != 1 || items[0] != guestCfg {
		t.Fatalf("synced after app1's delete: %v, want the configMap app2 still mounts", items)
	}
	h.kill("app2", "", 9)
	h.wait("app2", "")
	h.delete("app2", "")
	if items := h.svc.volumes.Items(); len(items) != 0 {
		t.Fatalf("still synced after the last container mounting them: %v", items)
	}
	h.kill("pod1", "", 9)
	h.wait("pod1", "")
	h.delete("pod1", "")
}

func TestEmptyDirMemoryIsATmpfsOfItsSize(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount the kubelet's tmpfs for a medium: Memory emptyDir")
	}
	pod := newKubeletPod(t)
	mem := pod.volume(t, "empty-dir", "scratch")
	if err := unix.Mount("tmpfs", mem, "tmpfs", 0, "size=8m,mode=0777"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mem, unix.MNT_DETACH) })
	env, agent := testEnv(t, "app")
	env.sandboxRoot = "/run/cube/disks/cube-slot-0"
	spec, _ := json.Marshal(map[string]any{"mounts": []specs.Mount{bindRW("/scratch", mem)}})
	out, err := guestSpec(context.Background(), spec, env)
	if err != nil {
		t.Fatal(err)
	}
	vs := agent.Volumes()
	if len(vs) != 1 || !vs[0].Tmpfs || vs[0].TmpfsSize != 8<<20 || vs[0].Path != "/run/cube/volumes/empty-dir/scratch" {
		t.Fatalf("PrepareVolume: %+v, want a tmpfs of 8 MiB", vs)
	}
	if !strings.Contains(string(out), `"source":"/run/cube/volumes/empty-dir/scratch"`) {
		t.Fatalf("guest spec: %s", out)
	}
}

// fakeShares records ShareHostDir calls.
type fakeShares struct {
	calls []string
	err   error
}

func (f *fakeShares) ShareHostDir(_ context.Context, r sandbox.ShareRequest) (string, error) {
	if f.err != nil {
		return "", f.err
	}
	if r.Destination != "/data" || r.Container == "" {
		return "", fmt.Errorf("share request without its mount: %+v", r)
	}
	f.calls = append(f.calls, fmt.Sprintf("%s ro=%v %s", r.Source, r.ReadOnly, r.Ref))
	return fmt.Sprintf("/run/cube/shared/v%d", len(f.calls)), nil
}

func (f *fakeShares) UnshareHostDir(string) error { return nil }

// Host directories that are not the kubelet's in-VM or copied volumes go
// through the sandbox's virtio-fs share, read-only when the mount is.
func TestHostDirectoriesAreShared(t *testing.T) {
	pod := newKubeletPod(t)
	pvc := filepath.Join(pod.volume(t, "csi", "pvc-0a1b"), "mount")
	if err := os.Mkdir(pvc, 0o755); err != nil {
		t.Fatal(err)
	}
	nfs := pod.volume(t, "nfs", "shared")
	hostPath := t.TempDir()
	for name, tc := range map[string]struct {
		m    specs.Mount
		want string
	}{
		"pvc":          {bindRW("/data", pvc), pvc + ` ro=false CSI (a PersistentVolume) volume "pvc-0a1b" at /data`},
		"nfs ro":       {bindRO("/data", nfs), nfs + ` ro=true nfs volume "shared" at /data`},
		"hostPath":     {bindRW("/data", hostPath), hostPath + " ro=false host directory " + hostPath + " at /data"},
		"ctr rbind:ro": {specs.Mount{Destination: "/data", Type: "bind", Source: hostPath, Options: []string{"rbind", "ro"}}, hostPath + " ro=true host directory " + hostPath + " at /data"},
	} {
		env, _ := testEnv(t, "app")
		sh := &fakeShares{}
		env.shares = sh
		spec, _ := json.Marshal(map[string]any{"mounts": []specs.Mount{tc.m}})
		out, err := guestSpec(context.Background(), spec, env)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if len(sh.calls) != 1 || sh.calls[0] != tc.want {
			t.Errorf("%s: ShareHostDir %q, want %q", name, sh.calls, tc.want)
		}
		if !strings.Contains(string(out), `"source":"/run/cube/shared/v1"`) || len(env.use.shared) != 1 {
			t.Errorf("%s: guest spec %s, use %+v", name, out, env.use)
		}
		if tc.m.Options[len(tc.m.Options)-1] == "ro" && !strings.Contains(string(out), `"ro"`) {
			t.Errorf("%s: the guest mount lost ro: %s", name, out)
		}
	}
	// The sandbox's refusal (a VM restored without the share) passes through.
	env, _ := testEnv(t, "app")
	env.shares = &fakeShares{err: fmt.Errorf("no share: %w", errdefs.ErrFailedPrecondition)}
	spec, _ := json.Marshal(map[string]any{"mounts": []specs.Mount{bindRW("/data", hostPath)}})
	if _, err := guestSpec(context.Background(), spec, env); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("share refused: %v, want FailedPrecondition", err)
	}
}

// Volumes the shim cannot serve are refused naming the volume and why.
func TestUnservableVolumesRefused(t *testing.T) {
	pod := newKubeletPod(t)
	subpath := filepath.Join(pod.root, "pods", pod.uid, "volume-subpaths", "cfg", "app", "0")
	if err := os.MkdirAll(subpath, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for name, tc := range map[string]struct {
		src  string
		want []string
	}{
		"subPath":  {subpath, []string{`subPath volume "cfg"`, "not served"}},
		"fifo":     {fifo, []string{"host fifo " + fifo, "virtio-fs shares directories"}},
		"socket":   {sock, []string{"host socket " + sock}},
		"char dev": {"/dev/null", []string{"host character device /dev/null"}},
	} {
		env, _ := testEnv(t, "app")
		sh := &fakeShares{}
		env.shares = sh
		spec, _ := json.Marshal(map[string]any{"mounts": []specs.Mount{bindRW("/mnt", tc.src)}})
		_, err := guestSpec(context.Background(), spec, env)
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
			continue
		}
		for _, w := range append(tc.want, "/mnt") {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", name, err, w)
			}
		}
		if len(sh.calls) != 0 {
			t.Errorf("%s: shared anyway: %v", name, sh.calls)
		}
	}
	// A configMap whose host tree holds a link out of it is refused at Create.
	cfg := pod.volume(t, "configmap", "evil")
	if err := os.Symlink("/etc/shadow", filepath.Join(cfg, "k")); err != nil {
		t.Fatal(err)
	}
	env, _ := testEnv(t, "app")
	spec, _ := json.Marshal(map[string]any{"mounts": []specs.Mount{bindRO("/etc/evil", cfg)}})
	_, err = guestSpec(context.Background(), spec, env)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), `configMap volume "evil"`) || !strings.Contains(err.Error(), "leaves the volume") {
		t.Fatalf("configMap with an escaping link: %v", err)
	}
}
