package task

import (
	"os"
	"path/filepath"
	"sort"
	"testing"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	apitask "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/core/runtime"
	"google.golang.org/grpc/codes"

	"github.com/cube-runtime/cube/shim/sandbox"
)

// listFiles names the entries of dir, failing on any subdirectory.
func listFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if !e.Type().IsRegular() {
			t.Errorf("%s/%s is not a regular file: CRI's unpack of the checkpoint tar breaks on it", dir, e.Name())
		}
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

// CRI's CheckpointContainer, for a runtime other than runc: no options, the
// path is containerd's temporary directory (it exists, empty). The snapshot's
// files lie flat in it.
func TestCheckpointFlatWithoutImagePath(t *testing.T) {
	h := newHarness(t)
	h.create("c1", []string{"sleep"}, nil, nil)
	h.start("c1", "")
	path := t.TempDir()
	if _, err := h.svc.Checkpoint(h.ctx, &taskAPI.CheckpointTaskRequest{ID: "c1", Path: path}); err != nil {
		t.Fatal(err)
	}
	got := listFiles(t, path)
	want := []string{sandbox.HostFactsName, "manifest.json"}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("checkpoint path holds %v, want %v (flat: no %s/)", got, want, CheckpointDirName)
	}
	ev := h.find(runtime.TaskCheckpointedEventTopic)
	if len(ev) != 1 || ev[0].(*eventstypes.TaskCheckpointed).Checkpoint != path {
		t.Fatalf("checkpointed events %v, want one naming %s", ev, path)
	}
	// The same directory again: refused, the first checkpoint kept.
	_, err := h.svc.Checkpoint(h.ctx, &taskAPI.CheckpointTaskRequest{ID: "c1", Path: path})
	wantCode(t, err, codes.AlreadyExists, "already holds a checkpoint")
	if got := listFiles(t, path); len(got) != 2 {
		t.Fatalf("after a refused second checkpoint: %v", got)
	}
}

// A CRI pod: the pause container and one app container. containerd's client
// pauses the app container's task around the checkpoint; both are allowed,
// the whole VM is captured, and the pause container does not count as
// another container. With a second app container both stay refused.
func TestCheckpointPodWithPauseContainer(t *testing.T) {
	h := newHarness(t)
	pause := map[string]string{SandboxIDAnnotation: "pod1", ContainerTypeAnnotation: "sandbox"}
	app := map[string]string{SandboxIDAnnotation: "pod1", ContainerTypeAnnotation: "container"}
	h.create("pod1", []string{"sleep"}, nil, pause)
	h.start("pod1", "")
	h.create("app1", []string{"sleep"}, nil, app)
	h.start("app1", "")

	if _, err := h.svc.Pause(h.ctx, &taskAPI.PauseRequest{ID: "app1"}); err != nil {
		t.Fatalf("pause of the pod's only app container: %v", err)
	}
	path := t.TempDir()
	if _, err := h.svc.Checkpoint(h.ctx, &taskAPI.CheckpointTaskRequest{ID: "app1", Path: path}); err != nil {
		t.Fatalf("checkpoint of the pod's only app container: %v", err)
	}
	if len(h.vmm.Snapshots) != 1 || !h.vmm.Paused || h.state("app1", "") != apitask.Status_PAUSED {
		t.Fatalf("snapshots %v paused %v: want one snapshot of the paused VM", h.vmm.Snapshots, h.vmm.Paused)
	}
	if got := listFiles(t, path); len(got) != 2 {
		t.Fatalf("checkpoint path holds %v", got)
	}
	if _, err := h.svc.Resume(h.ctx, &taskAPI.ResumeRequest{ID: "app1"}); err != nil {
		t.Fatal(err)
	}
	if h.vmm.Paused {
		t.Fatal("VM still paused after Resume")
	}

	h.create("app2", []string{"sleep"}, nil, app)
	h.start("app2", "")
	_, err := h.svc.Pause(h.ctx, &taskAPI.PauseRequest{ID: "app1"})
	wantCode(t, err, codes.FailedPrecondition, "1 other containers")
	_, err = h.svc.Checkpoint(h.ctx, &taskAPI.CheckpointTaskRequest{ID: "app1", Path: filepath.Join(t.TempDir(), "x")})
	wantCode(t, err, codes.FailedPrecondition, "1 other containers")
}
