package shim

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/guest-agent/protocol"
	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/hypervisor/virtio/net/taptest"
	"github.com/cube-runtime/cube/integration/cubetest"
	"github.com/cube-runtime/cube/integration/vmmrun"
)

// criCounterConfig is a CRI container whose init counts in /count (cubetest.CounterScript).
const criCounterConfig = `{
  "metadata": {"name": "%[1]s"},
  "image": {"image": "%[2]s"},
  "command": ["/bin/sh", "-c", "%[3]s"],
  "log_path": "%[1]s.log",
  "linux": {"security_context": {"namespace_options": {"network": 2, "pid": 1}}}
}`

// criCheckpointDir is where containerd's CRI puts the task checkpoint's files inside the archive
// (checkpointctl's CheckpointDirectory).
const criCheckpointDir = "checkpoint/"

// TestCRICheckpointPodVM: `crictl checkpoint --export` (CRI CheckpointContainer, what the kubelet's
// checkpoint API calls) of the app container of a Cube pod. containerd checks for criu (Debian's package,
// in the test host), pauses the task, calls the shim's Checkpoint without options, tars the shim's files
// into its content store, unpacks them one file per header into the archive's checkpoint/ and adds its own
// files. The archive holds the whole pod VM's snapshot flat; the pod carries on; the snapshot, taken out
// of the archive, restores in a new cube-vmm whose guest still counts.
func TestCRICheckpointPodVM(t *testing.T) {
	c := startCRI(t)
	podJSON := filepath.Join(c.Dir, "pod.json")
	config := fmt.Sprintf(criPodConfig, filepath.Join(c.Dir, "podlogs"))
	if c.PodNet {
		config = withPodNetwork(config)
	}
	os.WriteFile(podJSON, []byte(config), 0o644)
	out, err := c.crictl("runp", "--runtime", "cube", podJSON)
	if err != nil {
		t.Fatal(err)
	}
	pod := strings.TrimSpace(out)
	t.Cleanup(func() {
		c.crictl("stopp", pod)
		c.crictl("rmp", "-f", pod)
	})
	cj := filepath.Join(c.Dir, "counter.json")
	cconf := fmt.Sprintf(criCounterConfig, "counter", cubetest.ImageRef, cubetest.CounterScript)
	if c.PodNet {
		cconf = withPodNetwork(cconf)
	}
	os.WriteFile(cj, []byte(cconf), 0o644)
	out, err = c.crictl("create", pod, cj, podJSON)
	if err != nil {
		t.Fatal(err)
	}
	cid := strings.TrimSpace(out)
	if _, err := c.crictl("start", cid); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		t.Helper()
		var last string
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
			out, err := c.crictl("exec", "-s", cid, "cat", "/count")
			last = fmt.Sprint(out, err)
			if n, err2 := strconv.Atoi(strings.TrimSpace(out)); err == nil && err2 == nil {
				return n
			}
		}
		t.Fatalf("read /count in %s: %s", cid, last)
		return 0
	}
	before := count()

	archive := filepath.Join(c.Dir, "checkpoint.tar")
	if _, err := c.crictl("checkpoint", "--export="+archive, cid); err != nil {
		t.Fatalf("crictl checkpoint: %v", err)
	}

	// The pod carries on: containerd resumed the VM after the checkpoint.
	if out, err := c.crictl("inspect", "-o", "go-template", "--template", "{{.status.state}}", cid); err != nil || strings.TrimSpace(out) != "CONTAINER_RUNNING" {
		t.Errorf("container after the checkpoint: %q %v, want CONTAINER_RUNNING", out, err)
	}
	time.Sleep(time.Second)
	if after := count(); after <= before {
		t.Errorf("counter %d before the checkpoint, %d after: the pod did not carry on", before, after)
	}

	// The archive: the VM snapshot's files flat under checkpoint/.
	snapDir := t.TempDir()
	names := extractCheckpoint(t, archive, snapDir)
	os.Remove(archive) // the memory file is in it at full size: keep the test host's tmpfs free
	t.Logf("archive entries: %v", names)
	snap, err := snapshot.Open(snapDir)
	if err != nil {
		t.Fatalf("the archive's checkpoint/ is not a valid VM snapshot: %v", err)
	}
	want := []string{criCheckpointDir + snapshot.ManifestName, criCheckpointDir + snap.Manifest.State.File, criCheckpointDir + "cube-host.json"}
	for _, l := range snap.Manifest.Memory {
		want = append(want, criCheckpointDir+l.File)
	}
	for _, d := range snap.Manifest.Shape.Disks {
		if d.File != "" {
			want = append(want, criCheckpointDir+d.File)
		}
	}
	has := map[string]bool{}
	for _, n := range names {
		has[n] = true
	}
	for _, w := range want {
		if !has[w] {
			t.Errorf("archive lacks %s", w)
		}
	}
	writable := 0
	for _, d := range snap.Manifest.Shape.Disks {
		if d.File != "" {
			writable++
		}
	}
	// The whole pod VM: the pause container's disk and the app container's.
	if writable < 2 {
		t.Errorf("snapshot holds %d disk copies, want the pod's two (pause and app container): %+v", writable, snap.Manifest.Shape.Disks)
	}
	t.Logf("snapshot: %d vCPU(s), %d MiB, %d disks (%d copied)", snap.Manifest.Shape.VCPUs, snap.Manifest.Shape.MemoryMiB, len(snap.Manifest.Shape.Disks), writable)

	// The archive's snapshot in a new VMM: the container's process is there and counts on.
	rdir := t.TempDir()
	args := []string{"restore", "-disk-dir", rdir, "-control", rdir + "/ctl.sock",
		"-vsock", rdir + "/vsock.sock", "-console", rdir + "/console.log"}
	if c.PodNet {
		// The pod VM had a NIC on CNI's network (a tap the shim passed as an fd): the restored VM needs a
		// tap of its own; this one leads nowhere, which the counter does not mind.
		args = append(args, "-net", "tap="+taptest.Make(t, "ckpt", 0))
	}
	vmm := vmmrun.Start(t, cubetest.CubeVMM, append(args, snapDir)...)
	agent := dialAgent(t, rdir+"/vsock.sock", vmm)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if pids, err := agent.ListPids(ctx, &protocol.ListPidsRequest{ContainerId: cid}); err != nil || len(pids.Pids) == 0 {
		t.Fatalf("restored VM: pids of %s: %v %v", cid, pids, err)
	}
	// containerd paused the task around the checkpoint: the snapshot holds the guest's filesystems frozen.
	if _, err := agent.ThawFilesystems(ctx, &protocol.ThawRequest{}); err != nil {
		t.Fatalf("restored VM: thaw: %v", err)
	}
	readCount := func() int {
		t.Helper()
		r, err := agent.ReadFile(ctx, &protocol.ReadFileRequest{ContainerId: cid, Path: "/count", Length: 64})
		if err != nil {
			t.Fatalf("restored VM: read /count: %v", err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(r.Data)))
		if err != nil {
			t.Fatalf("restored VM: /count = %q", r.Data)
		}
		return n
	}
	first := readCount()
	time.Sleep(time.Second)
	if next := readCount(); next <= first || first < before {
		t.Errorf("restored VM: counter %d then %d (checkpoint taken after %d): the process did not resume", first, next, before)
	} else {
		t.Logf("restored VM from the CRI archive: counter %d then %d (checkpoint taken after %d)", first, next, before)
	}
	if _, err := agent.PowerOff(ctx, &protocol.PowerOffRequest{}); err != nil {
		t.Logf("restored VM: power off: %v", err)
	}
	if rc := vmm.Wait(t, time.Minute); rc != 0 {
		t.Errorf("restored cube-vmm exit %d, want 0 after power-off", rc)
	}
}

// extractCheckpoint writes the regular files under the archive's checkpoint/ into dir (flat: a name with
// a further directory is an error) and returns every entry name of the archive, sorted.
func extractCheckpoint(t *testing.T, archive, dir string) []string {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read %s: %v", archive, err)
		}
		name := strings.TrimPrefix(h.Name, "./")
		names = append(names, name)
		rest, ok := strings.CutPrefix(name, criCheckpointDir)
		if !ok || rest == "" || h.Typeflag != tar.TypeReg {
			continue
		}
		if rest != filepath.Base(rest) {
			t.Errorf("archive entry %s is not flat in %s", name, criCheckpointDir)
			continue
		}
		out, err := os.OpenFile(filepath.Join(dir, rest), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(out, tr); err != nil {
			t.Fatalf("extract %s: %v", name, err)
		}
		if err := out.Close(); err != nil {
			t.Fatal(err)
		}
	}
	sort.Strings(names)
	return names
}
