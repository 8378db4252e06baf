package store_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/checkpoint/store"
	"github.com/cube-runtime/cube/checkpoint/store/storetest"
)

// The crash helper: this test binary, run with STORETEST_CRASH set, does one
// thing on a store and exits without finishing it, as a crashed shim would.
func TestMain(m *testing.M) {
	if mode := os.Getenv("STORETEST_CRASH"); mode != "" {
		if err := crash(mode, os.Getenv("STORETEST_ROOT"), os.Getenv("STORETEST_ARG")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(3)
	}
	os.Exit(m.Run())
}

func crash(mode, root, arg string) error {
	ctx := context.Background()
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	s, err := store.Open(ctx, root, store.Options{Log: logrus.NewEntry(log)})
	if err != nil {
		return err
	}
	switch mode {
	case "begin": // a Begin whose VM snapshot is written, never committed
		p, err := s.Begin(ctx, store.BeginOptions{Sandbox: "sb-crash", Names: []string{"crashed"}})
		if err != nil {
			return err
		}
		if err := storetest.Write(p.Dir(), ""); err != nil {
			return err
		}
		fmt.Println(p.ID())
		// And a second one cube-vmm was still writing.
		p, err = s.Begin(ctx, store.BeginOptions{Sandbox: "sb-crash"})
		if err != nil {
			return err
		}
		fmt.Println(p.ID())
		return os.Mkdir(filepath.Join(root, "snapshots", "."+p.ID()+".tmp-1"), 0o700)
	case "op": // a fork: a snapshot and an incremental child, never kept or dropped
		var parent string
		for _, inc := range []bool{false, true} {
			p, err := s.Begin(ctx, store.BeginOptions{Sandbox: "sb-fork", Op: "fork-9"})
			if err != nil {
				return err
			}
			if err := storetest.Write(p.Dir(), parent); err != nil {
				return err
			}
			snap, err := p.Commit(ctx)
			if err != nil {
				return err
			}
			parent = snap.Dir
			fmt.Println(snap.ID, inc)
		}
		return nil
	case "acquire": // a VMM that maps arg and dies
		return s.Acquire(ctx, arg, store.Holder{Name: "crashed vmm"})
	}
	return fmt.Errorf("unknown mode %q", mode)
}

// runCrash runs the crash helper and returns the lines it printed.
func runCrash(t *testing.T, mode, root, arg string) []string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "STORETEST_CRASH="+mode, "STORETEST_ROOT="+root, "STORETEST_ARG="+arg)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
		t.Fatalf("crash helper %s: %v", mode, err)
	}
	return strings.Fields(string(out))
}

func TestCollectCrashedBegin(t *testing.T) {
	root := t.TempDir()
	s, _ := open(t, root)
	keep := take(t, s, "sb1", "keep")
	live, err := s.Begin(ctx, store.BeginOptions{Sandbox: "sb1", Names: []string{"mine"}}) // this process's: kept
	if err != nil {
		t.Fatal(err)
	}
	ids := runCrash(t, "begin", root, "")
	if len(ids) != 2 {
		t.Fatalf("helper printed %q", ids)
	}
	// While the helper ran, its Begin reserved "crashed"; now it is gone.
	s2, hook := open(t, root)
	for _, id := range ids {
		if !logged(hook, "collected: unfinished snapshot "+id, `sandbox \"sb-crash\"`) {
			t.Errorf("removal of %s not logged: %v", id, hook.AllEntries())
		}
		for _, p := range []string{filepath.Join(root, "snapshots", id), filepath.Join(root, "snapshots", "."+id+".tmp-1"), filepath.Join(root, "pending", id+".json")} {
			if exists(p) {
				t.Errorf("%s left after Open", p)
			}
		}
	}
	if exists(filepath.Join(root, "names", "crashed")) {
		t.Error("the crashed Begin's name reservation is left")
	}
	if _, err := s2.Get(ctx, keep.ID); err != nil {
		t.Errorf("committed snapshot lost: %v", err)
	}
	// This process's Begin survives another Store's Open, and commits.
	storetest.WriteVM(t, live.Dir(), "")
	if _, err := live.Commit(ctx); err != nil {
		t.Fatalf("live Begin after another Open: %v", err)
	}
	take(t, s2, "sb1", "crashed") // the reserved name is free again
}

func TestCollectCrashedOp(t *testing.T) {
	root := t.TempDir()
	s, _ := open(t, root)
	lines := runCrash(t, "op", root, "")
	if len(lines) != 4 {
		t.Fatalf("helper printed %q", lines)
	}
	parent, child := lines[0], lines[2]
	// Until the next Collect the op's snapshots are there, tagged.
	got, err := s.Get(ctx, child)
	if err != nil || got.Op != "fork-9" || got.Parent != parent {
		t.Fatalf("op snapshot before Collect: %+v %v", got, err)
	}
	// A clone still maps the child: both stay (the parent is the child's),
	// reported as kept.
	if err := s.Acquire(ctx, child, store.Holder{Name: "clone 1"}); err != nil {
		t.Fatal(err)
	}
	rep, err := s.Collect(ctx)
	if err != nil || len(rep.Removed) != 0 || len(rep.Kept) != 2 || !strings.Contains(rep.Kept[0], `held by "clone 1"`) || !strings.Contains(rep.Kept[1], "parent of "+child) {
		t.Fatalf("Collect while held: %+v %v", rep, err)
	}
	s.Release(ctx, child, "clone 1")
	rep, err = s.Collect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Removed) != 2 || !strings.Contains(rep.Removed[0], child) || !strings.Contains(rep.Removed[1], parent) || !strings.Contains(rep.Removed[0], "unfinished operation fork-9") {
		t.Errorf("report %q", rep.Removed)
	}
	if l, _, _ := s.List(ctx, store.ListOptions{}); len(l) != 0 {
		t.Errorf("left %+v", l)
	}
}

func TestOpKeepAndDrop(t *testing.T) {
	s, _ := open(t, t.TempDir())
	a := storetest.Take(t, s, store.BeginOptions{Sandbox: "sb1", Op: "fork-1"}, false)
	if a.Op != "fork-1" {
		t.Fatalf("op %q", a.Op)
	}
	b := storetest.Take(t, s, store.BeginOptions{Sandbox: "sb1", Op: "fork-2"}, false)
	c := storetest.Take(t, s, store.BeginOptions{Sandbox: "sb1", Op: "fork-2", Parent: b.ID}, true)
	// Live owner (this process): Collect keeps them.
	if rep, err := s.Collect(ctx); err != nil || len(rep.Removed) != 0 {
		t.Fatalf("Collect with live ops: %+v %v", rep, err)
	}
	kept, err := s.KeepOp(ctx, "fork-1")
	if err != nil || len(kept) != 1 || kept[0] != a.ID {
		t.Fatalf("KeepOp: %q %v", kept, err)
	}
	if got, _ := s.Get(ctx, a.ID); got.Op != "" {
		t.Errorf("kept snapshot still tagged %q", got.Op)
	}
	if err := s.Acquire(ctx, c.ID, store.Holder{Name: "clone 1"}); err != nil {
		t.Fatal(err)
	}
	dropped, err := s.DropOp(ctx, "fork-2")
	wantErr(t, err, errdefs.IsFailedPrecondition, c.ID, `"clone 1"`, b.ID, "parent of")
	if len(dropped) != 0 {
		t.Errorf("dropped %q while held", dropped)
	}
	s.Release(ctx, c.ID, "clone 1")
	dropped, err = s.DropOp(ctx, "fork-2")
	if err != nil || len(dropped) != 2 || dropped[0] != c.ID || dropped[1] != b.ID {
		t.Fatalf("DropOp: %q %v", dropped, err)
	}
	if l, _, _ := s.List(ctx, store.ListOptions{}); len(l) != 1 || l[0].ID != a.ID {
		t.Errorf("left %+v", l)
	}
}

func TestCollectLeftovers(t *testing.T) {
	root := t.TempDir()
	s, _ := open(t, root)
	keep := take(t, s, "sb1", "keep")
	gone := "00000000000000000000dead"
	dirs := []string{
		filepath.Join(root, "trash", gone),                  // an interrupted Delete
		filepath.Join(root, "snapshots", gone),              // a VM snapshot no Begin accounts for
		filepath.Join(root, "snapshots", "."+gone+".tmp-7"), // cube-vmm's, of no Begin
		filepath.Join(root, "refs", gone),                   // references to no snapshot
	}
	files := []string{
		filepath.Join(keep.Dir, ".cube-store.json.tmp-5"),      // a metadata write cut short
		filepath.Join(root, "pending", "."+gone+".json.tmp-3"), // a Begin's record cut short
	}
	for _, d := range dirs {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range files {
		if err := os.WriteFile(f, []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	made := append(dirs, files...)
	os.Symlink(gone, filepath.Join(root, "names", "stale"))
	foreign := filepath.Join(root, "snapshots", "lost+found")
	os.Mkdir(foreign, 0o700)

	s2, hook := open(t, root)
	for _, p := range append(made, filepath.Join(root, "names", "stale")) {
		if exists(p) {
			t.Errorf("%s left after Open", p)
		}
	}
	if !exists(foreign) || !logged(hook, "not a snapshot of this store", "lost+found") {
		t.Error("a directory the store did not make was removed or not reported")
	}
	for _, what := range []string{"collected: files of deleted snapshot " + gone, "collected: uncommitted VM snapshot directory " + gone, `collected: name \"stale\"`, "collected: references to missing snapshot " + gone, "collected: temporary file"} {
		if !logged(hook, what) {
			t.Errorf("not logged: %s", what)
		}
	}
	if got, err := s2.Get(ctx, "keep"); err != nil || got.ID != keep.ID {
		t.Errorf("committed snapshot: %+v %v", got, err)
	}
}
