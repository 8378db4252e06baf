package checkpoint

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/checkpoint/clone"
	"github.com/cube-runtime/cube/integration/cubetest"
)

// forked is `cube fork --json`'s output.
type forked struct {
	Op       string `json:"op"`
	Snapshot string `json:"snapshot"`
	Clones   []struct {
		ID      string `json:"id"`
		VMMPid  int    `json:"vmm_pid"`
		Error   string `json:"error"`
		Removed bool   `json:"removed"`
	} `json:"clones"`
}

// containers lists `ctr containers ls -q`.
func (d *daemons) containers(t *testing.T) map[string]bool {
	t.Helper()
	out, rc, err := d.CtrQuiet(nil, "containers", "ls", "-q")
	if err != nil || rc != 0 {
		t.Fatalf("ctr containers ls: rc %d %v\n%s", rc, err, out)
	}
	m := map[string]bool{}
	for _, f := range strings.Fields(out) {
		m[f] = true
	}
	return m
}

// memoryOf reads a process's Rss and Pss in kB (smaps_rollup).
func memoryOf(pid int) (rss, pss string) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return "?", "?"
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == "Rss:" {
			rss = f[1]
		} else if len(f) >= 2 && f[0] == "Pss:" {
			pss = f[1]
		}
	}
	return rss, pss
}

// TestCubeForkAndRestore is issue 14's fork and restore through the cube
// CLI: a running io.cube.v1 container with a held worker exec → `cube fork
// -n 3` → three new containers (new VMMs) whose workers answer with the
// source's counter, identity, pid and digest at the fork, then advance
// independently once released; /dev/urandom differs between them; the
// source is unchanged; the fork's temporary snapshot is gone. A fork whose
// third clone fails (its id is taken) with --all-or-nothing leaves no clone
// and no snapshot. Then `cube snapshot` of the source, the source removed,
// `cube restore` of that snapshot under a new id: equal, advances; the
// snapshot's deletion is refused while the restored VM maps it.
func TestCubeForkAndRestore(t *testing.T) {
	d := startDaemons(t)
	const src = "cube-fork-src"
	var held []string
	t.Cleanup(func() { d.emptyStore(t, held) })
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
	d.startWorker(t, src)
	at := d.workerAnswers(t, src, "hold")

	// What a fork that crashed after making a clone leaves: a container still marked pending by a process
	// that is gone. The next fork removes it first.
	if out, rc, err := d.Ctr("containers", "create", "--snapshotter", "cube", "--label", clone.LabelForkPending+"=fork-crashed/2147483646/1",
		cubetest.ImageRef, "crashed-clone", "true"); err != nil || rc != 0 {
		t.Fatalf("ctr containers create: rc %d %v\n%s", rc, err, out)
	}
	out, errOut, rc := d.CubeRun(t, "fork", src, "-n", "3", "--prefix", "clone", "--json")
	var f forked
	if rc != 0 || json.Unmarshal([]byte(out), &f) != nil || len(f.Clones) != 3 {
		t.Fatalf("cube fork -n 3: rc %d\n%s%s", rc, out, errOut)
	}
	for _, c := range f.Clones {
		t.Cleanup(func() { d.Remove(t, c.ID) })
	}
	if d.containers(t)["crashed-clone"] || !strings.Contains(errOut, "removed crashed-clone") {
		t.Errorf("the crashed fork's clone: still there %v, stderr %q", d.containers(t)["crashed-clone"], errOut)
	}
	// The clones the fork kept are no longer marked pending (a later fork would take them for a crashed one's).
	if pending, rc, err := d.CtrQuiet(nil, "containers", "ls", "-q", "labels.\""+clone.LabelForkPending+"\""); err != nil || rc != 0 || strings.TrimSpace(pending) != "" {
		t.Errorf("containers still marked pending after the fork: %q rc %d %v", pending, rc, err)
	}
	tasks := d.Tasks(t)
	pids := map[int]bool{srcTask.PID: true}
	for _, c := range f.Clones {
		tk := tasks[c.ID]
		if c.Error != "" || tk.Status != "RUNNING" || pids[tk.PID] || tk.PID != c.VMMPid {
			t.Errorf("clone %s: %+v, task %+v: want RUNNING in a VMM of its own", c.ID, c, tk)
		}
		pids[tk.PID] = true
		rss, pss := memoryOf(tk.PID)
		t.Logf("clone %s: VMM pid %d, Rss %s kB, Pss %s kB (memory shared with the other clones through the snapshot's files)", c.ID, tk.PID, rss, pss)
	}
	rss, pss := memoryOf(srcTask.PID)
	t.Logf("source: VMM pid %d, Rss %s kB, Pss %s kB", srcTask.PID, rss, pss)
	// Each clone's worker is the source's at the fork, exactly.
	for _, c := range f.Clones {
		if got := d.workerAnswers(t, c.ID, "query"); !got.same(at) {
			t.Errorf("clone %s's worker: %+v, want the source's %+v", c.ID, got, at)
		}
	}
	// Released one by one, they advance independently; the source stays held.
	for i, c := range f.Clones {
		d.workerAnswers(t, c.ID, "release")
		d.workerAbove(t, c.ID, at.Counter+int64(i))
	}
	if got := d.workerAnswers(t, src, "query"); !got.same(at) {
		t.Errorf("the source's held worker changed across the fork: %+v, want %+v", got, at)
	}
	if now := d.Tasks(t)[src]; now.Status != "RUNNING" || now.PID != srcTask.PID {
		t.Errorf("the source after the fork: %+v, want RUNNING with VMM pid %d", now, srcTask.PID)
	}
	// The clones' RNGs were reseeded: their random bytes differ.
	seen := map[string]string{}
	for _, c := range f.Clones {
		out, rc, err := d.CtrQuiet(nil, "task", "exec", "--exec-id", "rnd", c.ID, "busybox", "od", "-An", "-tx1", "-N16", "/dev/urandom")
		r := strings.Join(strings.Fields(out), "")
		if err != nil || rc != 0 || len(r) != 32 {
			t.Fatalf("read /dev/urandom in %s: rc %d %v\n%s", c.ID, rc, err, out)
		}
		if other, dup := seen[r]; dup {
			t.Errorf("clones %s and %s read the same random bytes %s", other, c.ID, r)
		}
		seen[r] = c.ID
	}
	// The fork's temporary snapshot is gone.
	if out, _ := d.Cube(t, "snapshots", "ls", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("the store after the fork: %q, want it empty", out)
	}

	// All or nothing: the third clone's id is taken, so its restore fails;
	// the two made are removed, the taken id's container is not touched.
	if out, rc, err := d.Ctr("containers", "create", "--snapshotter", "cube", "--runtime", "io.cube.v1", cubetest.ImageRef, "bad-3", "true"); err != nil || rc != 0 {
		t.Fatalf("ctr containers create bad-3: rc %d %v\n%s", rc, err, out)
	}
	t.Cleanup(func() { d.CtrQuiet(nil, "containers", "rm", "bad-3") })
	out, errOut, rc = d.CubeRun(t, "fork", src, "-n", "3", "--prefix", "bad", "--all-or-nothing")
	if rc != 1 || !strings.Contains(out, "bad-1 removed") || !strings.Contains(out, "bad-2 removed") || !strings.Contains(out+errOut, "bad-3 failed") {
		t.Errorf("fork with a failing third clone: rc %d\n%s%s", rc, out, errOut)
	}
	cs := d.containers(t)
	if cs["bad-1"] || cs["bad-2"] || !cs["bad-3"] {
		t.Errorf("containers after the failed all-or-nothing fork: %v", cs)
	}
	if _, ok := d.Tasks(t)["bad-1"]; ok {
		t.Error("a task of the failed fork is left")
	}
	if out, _ := d.Cube(t, "snapshots", "ls", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("the store after the failed fork: %q, want it empty", out)
	}

	// cube restore: a snapshot of the source (held), the source removed,
	// a new container from the snapshot.
	d.workerAnswers(t, src, "hold")
	at = d.workerAnswers(t, src, "query")
	snap := d.CubeJSON(t, "snapshot", src, "--name", "for-restore", "--json")
	held = append(held, snap.ID)
	d.Remove(t, src)
	srcRemoved = true
	const restored = "cube-restored"
	if out, errOut, rc := d.CubeRun(t, "restore", "for-restore", restored); rc != 0 {
		t.Fatalf("cube restore: rc %d\n%s%s", rc, out, errOut)
	}
	restoredRemoved := false
	t.Cleanup(func() {
		if !restoredRemoved {
			d.Remove(t, restored)
		}
	})
	d.WaitStatus(t, restored, "RUNNING", time.Minute)
	if got := d.workerAnswers(t, restored, "query"); !got.same(at) {
		t.Fatalf("the restored worker: %+v, want the snapshot's %+v", got, at)
	}
	d.workerAnswers(t, restored, "release")
	d.workerAbove(t, restored, at.Counter)
	if out, rc := d.Cube(t, "snapshots", "rm", "for-restore"); rc != 1 || !strings.Contains(out, "sandbox e2e/"+restored) {
		t.Errorf("rm of the snapshot the restored VM maps: rc %d\n%s", rc, out)
	}
	d.Remove(t, restored)
	restoredRemoved = true
}
