package checkpoint

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/cubetest"
)

// startWorker copies the worker (integration/snapshot/worker) into container
// id and runs it as an exec beside the init; it returns the exec's ctr.
func (d *daemons) startWorker(t *testing.T, id string) *cubetest.BG {
	t.Helper()
	bin, err := os.Open(workerBin)
	if err != nil {
		t.Fatalf("the worker binary: %v", err)
	}
	defer bin.Close()
	if out, rc, err := d.CtrQuiet(bin, "task", "exec", "--exec-id", "cp-worker", id, "sh", "-c", "cat > /worker && busybox chmod 755 /worker"); err != nil || rc != 0 {
		t.Fatalf("copy the worker into %s: rc %d %v\n%s", id, rc, err, out)
	}
	wk := d.CtrBG(t, "task", "exec", "--exec-id", "worker", id, "/worker", "serve", workerSock)
	d.workerAbove(t, id, 0)
	return wk
}

// checkpointLeftovers lists containerd's temporary checkpoint directories
// (containerd makes them in its temp directory, d.Dir/tmp; the shim removes
// the one a restore unpacked, containerd the one a checkpoint wrote).
func (d *daemons) checkpointLeftovers() []string {
	m, _ := filepath.Glob(filepath.Join(d.Dir, "tmp", "ctrd-checkpoint*"))
	return m
}

// TestCtrContainerRestore is issue 14's containerd restore: `ctr containers
// checkpoint --task --rw` of a running io.cube.v1 container whose worker exec
// is held → the container and its task removed → `ctr containers restore
// --live --rw` under a new id: a new VMM restored from the checkpoint, the
// worker answers with the checkpoint's counter, identity, pid and digest
// exactly, then counts on once released; the init's own counter runs on; the
// new container's execs work (the guest's container answers to the new id).
// Then the same on a second containerd (restoreElsewhere): the checkpoint
// image moved with `ctr images export` / `ctr images import --no-unpack`.
func TestCtrContainerRestore(t *testing.T) {
	d := startDaemons(t)
	const src, dst = "cube-cp-src", "cube-cp-dst"
	const ref = "docker.io/e2e/cube-checkpoint:1"
	args := append(append([]string{"run", "-d"}, cubetest.CubeRuntime.Args...), cubetest.ImageRef, src, "sh", "-c", cubetest.CounterScript)
	if out, rc, err := d.Ctr(args...); err != nil || rc != 0 {
		t.Fatalf("ctr run -d: rc %d %v\n%s", rc, err, out)
	}
	srcRemoved := false
	t.Cleanup(func() {
		if !srcRemoved {
			d.Remove(t, src)
		}
	})
	srcTask := d.WaitStatus(t, src, "RUNNING", time.Minute)
	d.CounterAbove(t, src, 0)
	wk := d.startWorker(t, src)
	at := d.workerAnswers(t, src, "hold")

	if out, rc, err := d.Ctr("containers", "checkpoint", "--task", "--rw", src, ref); err != nil || rc != 0 {
		t.Fatalf("ctr containers checkpoint --task --rw: rc %d %v\n%s", rc, err, out)
	}
	t.Cleanup(func() {
		if out, rc, err := d.CtrQuiet(nil, "images", "rm", "--sync", ref); err != nil || rc != 0 {
			t.Errorf("ctr images rm %s: rc %d %v\n%s", ref, rc, err, out)
		}
	})
	// The source ran on (ctr paused it around the checkpoint); then it goes.
	d.WaitStatus(t, src, "RUNNING", 10*time.Second)
	if st := d.workerAnswers(t, src, "query"); !st.same(at) {
		t.Fatalf("the held worker changed across the checkpoint: %+v, then %+v", at, st)
	}
	d.Remove(t, src)
	srcRemoved = true
	wk.Wait(t, time.Minute)

	if out, rc, err := d.Ctr("containers", "restore", "--live", "--rw", dst, ref); err != nil || rc != 0 {
		t.Fatalf("ctr containers restore --live --rw: rc %d %v\n%s", rc, err, out)
	}
	dstRemoved := false
	t.Cleanup(func() {
		if !dstRemoved {
			d.Remove(t, dst)
		}
	})
	dstTask := d.WaitStatus(t, dst, "RUNNING", time.Minute)
	if dstTask.PID == srcTask.PID || dstTask.PID <= 0 {
		t.Errorf("restored task's VMM pid %d, the source's was %d: want a new VMM", dstTask.PID, srcTask.PID)
	}
	got := d.workerAnswers(t, dst, "query")
	if !got.same(at) {
		t.Fatalf("the restored worker is %+v, want the checkpoint's %+v", got, at)
	}
	d.workerAnswers(t, dst, "release")
	d.workerAbove(t, dst, at.Counter)
	n := d.ReadCounter(t, dst)
	d.CounterAbove(t, dst, n)
	if left := d.checkpointLeftovers(); len(left) > 0 {
		t.Errorf("containerd's unpacked checkpoints left behind: %v", left)
	}

	// Ordering: dst goes before the second containerd starts: startDaemons
	// points the shim's config (/etc/cube/shim.toml) at the new daemons'
	// directory, and dst's shim would look for its state there when deleted.
	d.Remove(t, dst)
	dstRemoved = true
	d.restoreElsewhere(t, ref, at)
}

// restoreElsewhere is `ctr containers restore --live --rw` of the checkpoint
// image ref on a second containerd in the same test host (its own root,
// state, address, snapshotter and snapshot store; startDaemons' cleanups stop
// it and remove its directory): the image moved with `ctr images export` and
// `ctr images import --no-unpack`, the restored worker equals the
// checkpoint's (at), then advances.
func (d *daemons) restoreElsewhere(t *testing.T, ref string, at workerState) {
	tar := filepath.Join(d.Dir, "checkpoint.tar")
	// --skip-manifest-json: Docker's manifest.json describes image manifests; a checkpoint's index lists
	// its blobs (criu.tar, rw layer, spec) beside the image, and ctr fails to describe those.
	if out, rc, err := d.Ctr("images", "export", "--skip-manifest-json", tar, ref); err != nil || rc != 0 {
		t.Fatalf("ctr images export of the checkpoint: rc %d %v\n%s", rc, err, out)
	}
	defer os.Remove(tar)
	d2 := startDaemons(t)
	if out, rc, err := d2.Ctr("images", "import", "--no-unpack", tar); err != nil || rc != 0 {
		t.Fatalf("second containerd: ctr images import --no-unpack of the checkpoint: rc %d %v\n%s", rc, err, out)
	}
	const id = "cube-cp-elsewhere"
	if out, rc, err := d2.Ctr("containers", "restore", "--live", "--rw", id, ref); err != nil || rc != 0 {
		t.Fatalf("second containerd: ctr containers restore --live --rw: rc %d %v\n%s", rc, err, out)
	}
	t.Cleanup(func() { d2.Remove(t, id) })
	d2.WaitStatus(t, id, "RUNNING", time.Minute)
	if got := d2.workerAnswers(t, id, "query"); !got.same(at) {
		t.Fatalf("second containerd: the restored worker is %+v, want the checkpoint's %+v", got, at)
	}
	d2.workerAnswers(t, id, "release")
	d2.workerAbove(t, id, at.Counter)
	d2.CounterAbove(t, id, d2.ReadCounter(t, id))
	if left := d2.checkpointLeftovers(); len(left) > 0 {
		t.Errorf("second containerd: its unpacked checkpoints left behind: %v", left)
	}
}
