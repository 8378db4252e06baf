package checkpoint

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/integration/cubetest"
)

// TestCubeSnapshots is the user's path for snapshots: containerd 2.4.2, a
// running io.cube.v1 container, and the cube CLI: `cube snapshot --name s1`,
// then `--name s2 --incremental`, both in the store with their lineage and the
// shim's figures, the container running on (same VMM pid, its counter
// advancing), `cube snapshots ls/inspect/rm` (a parent's deletion refused),
// and three rounds of rollback in place, one to a snapshot other than the
// VM's parent (rollbackRounds: a worker exec killed after the snapshot
// answers again with its old state and pid, an exec started after it ends
// with 137, the sandbox holds the snapshot until it ends).
func TestCubeSnapshots(t *testing.T) {
	d := startDaemons(t)
	const id = "cube-snap"
	// Registered before the container: runs after its removal, when the
	// sandbox no longer holds the snapshot it rolled back to.
	var held []string
	t.Cleanup(func() { d.emptyStore(t, held) })
	tk := d.RunDetached(t, cubetest.CubeRuntime, id, "sh", "-c", cubetest.CounterScript)
	n := d.CounterAbove(t, id, 0)

	s1 := d.CubeJSON(t, "snapshot", id, "--name", "s1", "--json")
	if s1.Kind != "full" || strings.Join(s1.Names, ",") != "s1" || s1.Sandbox != "e2e/"+id || s1.Parent != "" || s1.Size <= 0 {
		t.Errorf("s1: %+v", s1)
	}
	if vm := s1.VM; vm == nil || vm.FrozenMS <= 0 || vm.TotalMS < vm.FrozenMS || vm.MemoryBytes <= 0 || int(vm.VMMPid) != tk.PID {
		t.Errorf("s1's figures: %+v (VMM pid %d)", s1.VM, tk.PID)
	} else {
		t.Logf("s1: frozen %.1f ms, total %.1f ms, memory %d bytes, disks %d bytes (reflinked %v), %d bytes on disk",
			vm.FrozenMS, vm.TotalMS, vm.MemoryBytes, vm.DiskBytes, vm.Reflinked, s1.Size)
	}
	if _, err := snapshot.Open(s1.Dir); err != nil {
		t.Errorf("s1 is not a VM snapshot cube-vmm can restore: %v", err)
	}
	// The container runs on between and after the snapshots.
	n = d.CounterAbove(t, id, n)

	s2 := d.CubeJSON(t, "snapshot", id, "--name", "s2", "--incremental", "--json")
	if s2.Kind != "incremental" || s2.Parent != s1.ID || s2.VM == nil || !s2.VM.Incremental || !s2.VM.Base {
		t.Errorf("s2: %+v (vm %+v), want incremental over %s", s2, s2.VM, s1.ID)
	}
	d.CounterAbove(t, id, n)
	if now := d.Tasks(t)[id]; now.Status != "RUNNING" || now.PID != tk.PID {
		t.Errorf("after two snapshots the task is %+v, want RUNNING with VMM pid %d", now, tk.PID)
	}

	out, rc := d.Cube(t, "snapshots", "ls", "--sandbox", id)
	if rc != 0 || !strings.Contains(out, s1.ID) || !strings.Contains(out, s2.ID) || !strings.Contains(out, "incremental") {
		t.Errorf("snapshots ls: rc %d\n%s", rc, out)
	}
	for _, ref := range []string{"s1", s1.ID} {
		got := d.CubeJSON(t, "snapshots", "inspect", ref)
		if got.ID != s1.ID || got.Dir != s1.Dir || got.VM == nil || got.VM.Base {
			t.Errorf("inspect %s: %+v (vm %+v)", ref, got, got.VM)
		}
	}

	// s1 is s2's parent: its deletion is refused, naming s2.
	if out, rc := d.Cube(t, "snapshots", "rm", "s1"); rc != 1 || !strings.Contains(out, "is the parent of "+s2.ID) {
		t.Errorf("rm s1 (s2's parent): rc %d\n%s", rc, out)
	}
	if out, rc := d.Cube(t, "snapshots", "rm", "s2"); rc != 0 || strings.TrimSpace(out) != s2.ID {
		t.Errorf("rm s2: rc %d\n%s", rc, out)
	}
	if out, _ := d.Cube(t, "snapshots", "ls", "-q"); strings.Join(strings.Fields(out), " ") != s1.ID {
		t.Errorf("ls after rm s2:\n%s", out)
	}
	if _, err := os.Stat(s2.Dir); !os.IsNotExist(err) {
		t.Errorf("s2's directory after rm: %v", err)
	}

	// A runc container is not a VM: refused, saying so (when runc is in the test host).
	if _, err := os.Stat("/cube/bin/runc"); err == nil {
		d.RunDetached(t, cubetest.RuncRuntime, "cube-snap-runc", "sleep", "1000")
		if out, rc := d.Cube(t, "snapshot", "cube-snap-runc"); rc != 1 || !strings.Contains(out, "runs with runtime io.containerd.runc.v2") {
			t.Errorf("snapshot of a runc container: rc %d\n%s", rc, out)
		}
	}

	// Rollback in place, with a worker exec beside the long-lived init.
	held = append(held, d.rollbackRounds(t, id, tk.PID)...)

	// s1 goes now; the snapshot the sandbox rolled back to goes once the
	// container is removed (emptyStore, at the end).
	if out, rc := d.Cube(t, "snapshots", "rm", "s1"); rc != 0 {
		t.Errorf("rm s1: rc %d\n%s", rc, out)
	}
}

// emptyStore deletes the snapshots in refs (the container that held them is
// gone by now) and checks that nothing is left in the store.
func (d *daemons) emptyStore(t *testing.T, refs []string) {
	for _, ref := range refs {
		if out, rc := d.Cube(t, "snapshots", "rm", ref); rc != 0 {
			t.Errorf("rm %s after its sandbox ended: rc %d\n%s", ref, rc, out)
		}
	}
	for _, sub := range []string{"snapshots", "pending", "names"} {
		if ents, err := os.ReadDir(filepath.Join(d.StoreRoot(), sub)); err != nil || len(ents) != 0 {
			t.Errorf("store %s/ after removing everything: %v %v", sub, ents, err)
		}
	}
}
