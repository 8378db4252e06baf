package task

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	apitask "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/shim/config"
	"github.com/cube-runtime/cube/shim/sandbox"
)

// testManifest is a valid manifest of a one-container Cube sandbox: slot 0
// holds the container's rootfs, slot 1 is a stub.
func testManifest(kernelSHA string) snapshot.Manifest {
	return snapshot.Manifest{
		FormatVersion: snapshot.Version,
		Shape: snapshot.Shape{VCPUs: 1, MemoryMiB: 64, Disks: []snapshot.Disk{
			{Serial: sandbox.SlotSerial(0), Size: 4096, File: snapshot.DiskName(0), Source: "/var/lib/cube-snapshotter/snapshots/7/rootfs.img"},
			{Serial: sandbox.SlotSerial(1), Size: 4096, File: snapshot.DiskName(1), Source: "/run/cube/shim/0123/slot-1.img"},
		}},
		Components: snapshot.Components{KernelSHA256: kernelSHA, VMMVersion: snapshot.VMMVersion()},
		Memory:     []snapshot.MemoryLayer{{File: snapshot.MemoryName, Size: 64 << 20}},
		State:      snapshot.StateFile{File: snapshot.StateName, Size: 4096},
	}
}

// writeCheckpoint writes m as dir/vm/manifest.json (and facts, when not
// nil, as dir/cube-host.json); it returns the vm directory.
func writeCheckpoint(t *testing.T, dir string, m snapshot.Manifest, facts *sandbox.HostFacts) string {
	t.Helper()
	vm := filepath.Join(dir, CheckpointDirName)
	if err := os.MkdirAll(vm, 0o700); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(vm, snapshot.ManifestName), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if facts != nil {
		b, _ := json.Marshal(facts)
		if err := os.WriteFile(filepath.Join(dir, sandbox.HostFactsName), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return vm
}

func TestCheckpointVM(t *testing.T) {
	top := t.TempDir()
	unpackedDir := filepath.Join(top, "ctrd-checkpoint123")
	vm := writeCheckpoint(t, unpackedDir, testManifest(""), nil)
	if got, unpacked, err := checkpointVM(unpackedDir); err != nil || got != vm || !unpacked {
		t.Errorf("containerd's unpacked checkpoint: %s %v %v", got, unpacked, err)
	}
	// containerd's unpacked copy of a checkpoint written flat (no ImagePath): removed too.
	flat := filepath.Join(top, "ctrd-checkpoint456")
	writeCheckpoint(t, flat, testManifest(""), nil)
	if err := os.Rename(filepath.Join(flat, CheckpointDirName, snapshot.ManifestName), filepath.Join(flat, snapshot.ManifestName)); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(flat, CheckpointDirName))
	if got, unpacked, err := checkpointVM(flat); err != nil || got != flat || !unpacked {
		t.Errorf("containerd's unpacked flat checkpoint: %s %v %v", got, unpacked, err)
	}
	// A store snapshot (runc's CriuImagePath): the manifest at the top, never removed.
	if got, unpacked, err := checkpointVM(vm); err != nil || got != vm || unpacked {
		t.Errorf("a VM snapshot directory: %s %v %v", got, unpacked, err)
	}
	// --image-path of the user's: vm/ inside, not containerd's: kept.
	own := filepath.Join(top, "mine")
	writeCheckpoint(t, own, testManifest(""), nil)
	if _, unpacked, err := checkpointVM(own); err != nil || unpacked {
		t.Errorf("the user's checkpoint directory: %v %v", unpacked, err)
	}
	for _, bad := range []string{t.TempDir(), "rel/dir", top + "/../x"} {
		if _, _, err := checkpointVM(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("checkpoint %q: %v, want invalid argument", bad, err)
		}
	}
}

func TestPlanRestore(t *testing.T) {
	kernel := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(kernel, []byte("a kernel"), 0o600); err != nil {
		t.Fatal(err)
	}
	sum, _ := fileSHA256(kernel)
	cfg := config.Default()
	cfg.Kernel = kernel
	here := &sandbox.HostFacts{CPUVendor: "AuthenticAMD", CPUModel: "EPYC", CPUFlags: []string{"fpu", "sse2", "svm"}}

	vm := writeCheckpoint(t, t.TempDir(), testManifest(sum), &sandbox.HostFacts{CPUVendor: "AuthenticAMD", CPUFlags: []string{"fpu", "sse2"}})
	p, err := planRestore(vm, cfg, here)
	if err != nil || p.slots != 2 || p.rootfsSerial != sandbox.SlotSerial(0) || len(p.nicMACs) != 0 {
		t.Fatalf("plan %+v %v", p, err)
	}
	// The VM's NICs come from cube-vmm's configuration in the manifest.
	withNIC := testManifest(sum)
	withNIC.Config = json.RawMessage(`{"Kernel":"/k","Net":[{"FD":3,"MAC":"02:42:0a:62:00:07"}]}`)
	if p, err := planRestore(writeCheckpoint(t, t.TempDir(), withNIC, nil), cfg, here); err != nil || len(p.nicMACs) != 1 || p.nicMACs[0] != "02:42:0a:62:00:07" {
		t.Errorf("plan with a NIC: %+v %v", p, err)
	}

	for _, c := range []struct {
		name  string
		edit  func(*snapshot.Manifest)
		facts *sandbox.HostFacts
		want  string
	}{
		{"another VMM", func(m *snapshot.Manifest) { m.Components.VMMVersion = "cube-vmm/0 state/0" }, nil, `made by "cube-vmm/0 state/0"`},
		{"another kernel", func(m *snapshot.Manifest) { m.Components.KernelSHA256 = strings.Repeat("0", 64) }, nil, "ran guest kernel sha256 000"},
		{"another CPU vendor", nil, &sandbox.HostFacts{CPUVendor: "GenuineIntel", CPUModel: "Xeon", CPUFlags: []string{"fpu"}}, "taken on a GenuineIntel CPU (Xeon)"},
		{"missing CPU features", nil, &sandbox.HostFacts{CPUVendor: "AuthenticAMD", CPUFlags: []string{"fpu", "avx512f", "sse2"}}, "lacks: avx512f"},
		{"a pod", func(m *snapshot.Manifest) { m.Shape.Disks[1].Source = "/images/other.ext4" }, nil, "both hold a container's rootfs"},
		{"no rootfs", func(m *snapshot.Manifest) { m.Shape.Disks[0].Source = "/x/slot-0.img" }, nil, "no drive holds"},
		{"not a Cube sandbox", func(m *snapshot.Manifest) { m.Shape.Disks[0].Serial = "root" }, nil, `serial "root"`},
		{"a NIC without a MAC", func(m *snapshot.Manifest) { m.Config = json.RawMessage(`{"Net":[{"FD":3}]}`) }, nil, "network device 0 has no MAC"},
		{"a garbled VMM config", func(m *snapshot.Manifest) { m.Config = json.RawMessage(`{"Net":5}`) }, nil, "VMM configuration"},
	} {
		m := testManifest(sum)
		if c.edit != nil {
			c.edit(&m)
		}
		vm := writeCheckpoint(t, t.TempDir(), m, c.facts)
		_, err := planRestore(vm, cfg, here)
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want a failed precondition saying %q", c.name, err, c.want)
		}
	}
	// Another snapshot format: refused before anything else.
	vm = writeCheckpoint(t, t.TempDir(), testManifest(sum), nil)
	os.WriteFile(filepath.Join(vm, snapshot.ManifestName), []byte(`{"format_version":99}`), 0o600)
	if _, err := planRestore(vm, cfg, here); !errors.Is(err, snapshot.ErrVersion) || !errdefs.IsFailedPrecondition(err) {
		t.Errorf("format 99: %v", err)
	}
}

// checkpointedGuest runs container "old" (init and a worker exec) in a
// first shim and returns the fake agent's state as a checkpoint saves it.
func checkpointedGuest(t *testing.T) *harness {
	t.Helper()
	h := newHarness(t)
	h.create("old", []string{"sleep"}, nil, nil)
	h.start("old", "")
	h.exec("old", "worker", []string{"sleep"}, nil, false)
	h.start("old", "worker")
	return h
}

func TestCreateFromCheckpoint(t *testing.T) {
	src := checkpointedGuest(t)
	saved := src.agent.Save()

	h := newHarness(t)
	h.agent.Restore(saved) // what the restored VM's memory holds
	dir := filepath.Join(t.TempDir(), "ctrd-checkpoint42")
	vm := writeCheckpoint(t, dir, testManifest(""), nil)
	req := &taskAPI.CreateTaskRequest{ID: "new", Bundle: h.bundle("new", []string{"sleep"}, false, nil),
		Rootfs: rootfs("/images/new.ext4"), Checkpoint: dir}
	if _, err := h.svc.Create(h.ctx, req); err != nil {
		t.Fatal(err)
	}
	if h.vmm.Config.Template != vm || h.vmm.Config.DiskPaths[sandbox.SlotSerial(0)] != "/images/new.ext4" || len(h.vmm.Config.DiskPaths) != 1 {
		t.Errorf("VMM restore config: template %s, disk paths %v", h.vmm.Config.Template, h.vmm.Config.DiskPaths)
	}
	if got := strings.Join(h.agent.Containers(), ","); got != "new" {
		t.Errorf("guest containers after the restore: %s, want the guest's renamed to new", got)
	}
	if h.state("new", "") != apitask.Status_CREATED || !h.vmm.Paused {
		t.Errorf("after create: %v, VM paused %v; want CREATED and paused until start", h.state("new", ""), h.vmm.Paused)
	}
	if h.agent.CallCount("ThawFilesystems") == 0 || h.agent.CallCount("Freshen") == 0 {
		t.Errorf("restored guest not freshened: %v", h.agent.CallLog())
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("containerd's unpacked checkpoint %s after the restore: %v", dir, err)
	}
	// A second container cannot restore into this shim's VM.
	req2 := &taskAPI.CreateTaskRequest{ID: "new2", Bundle: h.bundle("new2", []string{"sleep"}, false, nil),
		Rootfs: rootfs("/images/new2.ext4"), Checkpoint: writeCheckpoint(t, t.TempDir(), testManifest(""), nil)}
	_, err := h.svc.Create(h.ctx, req2)
	wantCode(t, err, codes.FailedPrecondition, "already runs sandbox")

	h.start("new", "")
	if h.state("new", "") != apitask.Status_RUNNING || h.vmm.Paused {
		t.Errorf("after start: %v, VM paused %v", h.state("new", ""), h.vmm.Paused)
	}
	// The guest's exec is there under the new id; new execs work.
	if st := h.agent.ProcessStatus("new", "worker"); st != "running" {
		t.Errorf("the checkpoint's worker exec: %q", st)
	}
	h.exec("new", "e1", []string{"exit", "3"}, nil, false)
	h.start("new", "e1")
	if code := h.wait("new", "e1"); code != 3 {
		t.Errorf("exec in the restored container: exit %d", code)
	}
	if _, err := h.svc.Kill(h.ctx, &taskAPI.KillRequest{ID: "new", Signal: 9}); err != nil {
		t.Fatal(err)
	}
	if code := h.wait("new", ""); code != 137 {
		t.Errorf("killed restored init: exit %d", code)
	}
	h.delete("new", "")
}

func TestCreateFromCheckpointRefusals(t *testing.T) {
	saved := checkpointedGuest(t).agent.Save()

	// The agent cannot rename (a snapshot of an older agent): the VM goes.
	h := newHarness(t)
	h.agent.Restore(saved)
	h.agent.RenameErr = errors.New("unknown method RenameContainer")
	req := &taskAPI.CreateTaskRequest{ID: "new", Bundle: h.bundle("new", []string{"sleep"}, false, nil),
		Rootfs: rootfs("/images/new.ext4"), Checkpoint: writeCheckpoint(t, t.TempDir(), testManifest(""), nil)}
	_, err := h.svc.Create(h.ctx, req)
	if err == nil || !strings.Contains(err.Error(), "rename the guest's container old to new") {
		t.Fatalf("restore with an agent that cannot rename: %v", err)
	}
	select {
	case <-h.vmm.Wait():
	default:
		t.Error("the VM of a failed restore still runs")
	}
	if _, err := h.svc.State(h.ctx, &taskAPI.StateRequest{ID: "new"}); err == nil {
		t.Error("the failed restore's container is known")
	}

	// A checkpoint without a VM snapshot, and one of another format: refused
	// before a VM starts.
	h = newHarness(t)
	req.Checkpoint = t.TempDir()
	_, err = h.svc.Create(h.ctx, req)
	wantCode(t, err, codes.InvalidArgument, "holds no VM snapshot")
	m := testManifest("")
	m.Components.VMMVersion = "cube-vmm/0"
	req.Checkpoint = filepath.Dir(writeCheckpoint(t, t.TempDir(), m, nil))
	_, err = h.svc.Create(h.ctx, req)
	wantCode(t, err, codes.FailedPrecondition, "made by")
	if h.boots != 0 {
		t.Errorf("%d VMs started for refused checkpoints", h.boots)
	}

	// The guest runs no running container (its init had exited).
	h = newHarness(t)
	h.agent.Restore(saved)
	if err := h.agent.Signal(h.ctx, "old", "", 9, false); err != nil {
		t.Fatal(err)
	}
	req.Checkpoint = filepath.Dir(writeCheckpoint(t, t.TempDir(), testManifest(""), nil))
	for i := 0; h.agent.ProcessStatus("old", "") != "stopped" && i < 200; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	_, err = h.svc.Create(h.ctx, req)
	if err == nil {
		t.Error("restore of a guest whose init had exited: no error")
	}
}
