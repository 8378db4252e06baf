package store_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/cube-runtime/cube/checkpoint/store"
	"github.com/cube-runtime/cube/checkpoint/store/storetest"
	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

var ctx = context.Background()

// open opens a store on root with a logger whose entries the test can read.
func open(t *testing.T, root string) (*store.Store, *logtest.Hook) {
	t.Helper()
	logger, hook := logtest.NewNullLogger()
	logger.SetLevel(logrus.DebugLevel)
	s, err := store.Open(ctx, root, store.Options{Log: logrus.NewEntry(logger)})
	if err != nil {
		t.Fatal(err)
	}
	return s, hook
}

func take(t *testing.T, s *store.Store, sandbox string, names ...string) store.Snapshot {
	t.Helper()
	return storetest.Take(t, s, store.BeginOptions{Sandbox: sandbox, Names: names}, false)
}

func takeOver(t *testing.T, s *store.Store, parent store.Snapshot, names ...string) store.Snapshot {
	t.Helper()
	return storetest.Take(t, s, store.BeginOptions{Sandbox: parent.Sandbox, Parent: parent.ID, Names: names}, true)
}

// wantErr checks err's errdefs class and that its message holds every part.
func wantErr(t *testing.T, err error, class func(error) bool, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one with %q", parts)
	}
	if !class(err) {
		t.Errorf("error %q: wrong errdefs class", err)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not say %q", err, p)
		}
	}
}

func logged(hook *logtest.Hook, parts ...string) bool {
	for _, e := range hook.AllEntries() {
		line, _ := e.String()
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			return true
		}
	}
	return false
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func TestCommitAndGet(t *testing.T) {
	root := t.TempDir()
	s, _ := open(t, root)
	before := time.Now()
	p, err := s.Begin(ctx, store.BeginOptions{Sandbox: "sb1", Names: []string{"warm", "v1.0"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(root, "snapshots", p.ID()); p.Dir() != want {
		t.Fatalf("Dir %s, want %s", p.Dir(), want)
	}
	if exists(p.Dir()) {
		t.Fatal("Dir exists before cube-vmm wrote it")
	}
	if _, err := s.Get(ctx, p.ID()); !errdefs.IsNotFound(err) {
		t.Fatalf("pending snapshot visible to Get: %v", err)
	}
	storetest.WriteVM(t, p.Dir(), "")
	snap, err := p.Commit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if snap.ID != p.ID() || snap.Sandbox != "sb1" || snap.Kind != store.Full || snap.Parent != "" || snap.Dir != p.Dir() || snap.Op != "" {
		t.Errorf("committed %+v", snap)
	}
	if !reflect.DeepEqual(snap.Names, []string{"v1.0", "warm"}) {
		t.Errorf("names %q", snap.Names)
	}
	if snap.Size < snapshot.PageSize {
		t.Errorf("size %d, want at least the one page written", snap.Size)
	}
	if snap.Created.Before(before) || snap.Created.After(time.Now()) {
		t.Errorf("created %v", snap.Created)
	}
	for _, ref := range []string{snap.ID, "warm", "v1.0"} {
		got, err := s.Get(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, snap) {
			t.Errorf("Get(%s) = %+v, want %+v", ref, got, snap)
		}
	}
	if _, err := snapshot.Open(snap.Dir); err != nil {
		t.Errorf("the VM snapshot no longer opens: %v", err)
	}
	if _, err := p.Commit(ctx); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("second Commit: %v", err)
	}
	if err := p.Abort(ctx); err != nil || !exists(snap.Dir) {
		t.Errorf("Abort after Commit: %v, dir there: %v", err, exists(snap.Dir))
	}
}

func TestIncremental(t *testing.T) {
	s, _ := open(t, t.TempDir())
	full := take(t, s, "sb1")
	inc := takeOver(t, s, full)
	if inc.Kind != store.Incremental || inc.Parent != full.ID {
		t.Fatalf("incremental: kind %s parent %s, want %s", inc.Kind, inc.Parent, full.ID)
	}
	// The parent is read from the VM snapshot when Begin did not name it.
	p, err := s.Begin(ctx, store.BeginOptions{Sandbox: "sb1"})
	if err != nil {
		t.Fatal(err)
	}
	storetest.WriteVM(t, p.Dir(), inc.Dir)
	inc2, err := p.Commit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if inc2.Kind != store.Incremental || inc2.Parent != inc.ID {
		t.Fatalf("incremental over %s: kind %s parent %s", inc.ID, inc2.Kind, inc2.Parent)
	}
	// A full snapshot records the parent Begin names (lineage only).
	lin := storetest.Take(t, s, store.BeginOptions{Sandbox: "sb1", Parent: inc2.ID}, false)
	if lin.Kind != store.Full || lin.Parent != inc2.ID {
		t.Fatalf("full with lineage: kind %s parent %s", lin.Kind, lin.Parent)
	}
}

func TestCommitRefusals(t *testing.T) {
	s, _ := open(t, t.TempDir())
	a := take(t, s, "sb1")
	b := take(t, s, "sb1")

	p, err := s.Begin(ctx, store.BeginOptions{Sandbox: "sb1"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Commit(ctx)
	wantErr(t, err, errdefs.IsFailedPrecondition, p.ID(), "nothing at "+p.Dir(), "cube-vmm")
	if err := os.MkdirAll(p.Dir(), 0o700); err != nil {
		t.Fatal(err)
	}
	_, err = p.Commit(ctx)
	wantErr(t, err, errdefs.IsFailedPrecondition, "does not open", "Abort")
	if err := p.Abort(ctx); err != nil {
		t.Fatal(err)
	}

	// Begin named b, the VM wrote over a.
	p, err = s.Begin(ctx, store.BeginOptions{Sandbox: "sb1", Parent: b.ID})
	if err != nil {
		t.Fatal(err)
	}
	storetest.WriteVM(t, p.Dir(), a.Dir)
	_, err = p.Commit(ctx)
	wantErr(t, err, errdefs.IsFailedPrecondition, "over "+a.ID, "named parent "+b.ID)
	if err := p.Abort(ctx); err != nil {
		t.Fatal(err)
	}

	_, err = s.Begin(ctx, store.BeginOptions{Sandbox: "sb1", Parent: "nosuch"})
	wantErr(t, err, errdefs.IsNotFound, "parent", `"nosuch"`)
	_, err = s.Begin(ctx, store.BeginOptions{})
	wantErr(t, err, errdefs.IsInvalidArgument, "sandbox is empty")
	_, err = s.Begin(ctx, store.BeginOptions{Sandbox: "sb\n1"})
	wantErr(t, err, errdefs.IsInvalidArgument, "sandbox", "control character")
	_, err = s.Begin(ctx, store.BeginOptions{Sandbox: "sb1", Op: "fork 1"})
	wantErr(t, err, errdefs.IsInvalidArgument, `op "fork 1"`, "only letters")
	_, err = s.Begin(ctx, store.BeginOptions{Sandbox: "sb1", Names: []string{"x", "x"}})
	wantErr(t, err, errdefs.IsInvalidArgument, `name "x" given twice`)
	if l, _, _ := s.List(ctx, store.ListOptions{}); len(l) != 2 {
		t.Errorf("%d snapshots after refusals, want 2", len(l))
	}
}

func TestAbort(t *testing.T) {
	root := t.TempDir()
	s, _ := open(t, root)
	p, err := s.Begin(ctx, store.BeginOptions{Sandbox: "sb1", Names: []string{"try"}})
	if err != nil {
		t.Fatal(err)
	}
	storetest.WriteVM(t, p.Dir(), "")
	// What cube-vmm leaves while writing, too.
	if err := os.Mkdir(filepath.Join(root, "snapshots", "."+p.ID()+".tmp-123"), 0o700); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel() // Abort cleans up even so
	if err := p.Abort(cctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Abort(ctx); err != nil {
		t.Errorf("second Abort: %v", err)
	}
	for _, d := range []string{"snapshots", "pending", "names"} {
		if n, _ := os.ReadDir(filepath.Join(root, d)); len(n) != 0 {
			t.Errorf("%s/ holds %v after Abort", d, n)
		}
	}
	if _, err := p.Commit(ctx); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Commit after Abort: %v", err)
	}
	take(t, s, "sb1", "try") // the name is free again
}

func TestOpenRefusals(t *testing.T) {
	_, err := store.Open(ctx, "", store.Options{})
	wantErr(t, err, errdefs.IsInvalidArgument, "no root", store.DefaultRoot)
	root := t.TempDir()
	open(t, root)
	os.WriteFile(filepath.Join(root, "store-version"), []byte("2\n"), 0o600)
	_, err = store.Open(ctx, root, store.Options{})
	wantErr(t, err, errdefs.IsFailedPrecondition, "format version 2", "reads 1")
	if !errors.Is(err, store.ErrVersion) {
		t.Errorf("not ErrVersion: %v", err)
	}
	os.WriteFile(filepath.Join(root, "store-version"), []byte("one"), 0o600)
	_, err = store.Open(ctx, root, store.Options{})
	wantErr(t, err, errdefs.IsDataLoss, "not a version number")
}

func TestDefaultRoot(t *testing.T) {
	if store.DefaultRoot != store.RootBeside(store.SnapshotterRoot) || !strings.HasPrefix(store.DefaultRoot, "/var/lib/cube-snapshotter/") {
		t.Errorf("DefaultRoot %s is not on the snapshotter's pool %s", store.DefaultRoot, store.SnapshotterRoot)
	}
}

// Everything is on disk: a new Store on the root (a restarted process)
// sees the same snapshots, names, lineage and references.
func TestReopen(t *testing.T) {
	root := t.TempDir()
	s, _ := open(t, root)
	full := take(t, s, "sb1", "base")
	inc := takeOver(t, s, full, "after-step-1")
	take(t, s, "sb2")
	if err := s.Acquire(ctx, inc.ID, store.Holder{Name: "sandbox sb1"}); err != nil {
		t.Fatal(err)
	}
	before, _, err := s.List(ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s2, _ := open(t, root)
	after, _, err := s2.List(ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(before, after) || len(after) != 3 {
		t.Fatalf("after reopening:\n%+v\nwant\n%+v", after, before)
	}
	if after[1].Parent != full.ID || after[1].Kind != store.Incremental || len(after[1].Holders) != 1 {
		t.Errorf("incremental after reopening: %+v", after[1])
	}
	wantErr(t, s2.Delete(ctx, "base"), errdefs.IsFailedPrecondition, "parent of "+inc.ID)
	wantErr(t, s2.Delete(ctx, "after-step-1"), errdefs.IsFailedPrecondition, "sandbox sb1")
}
