package clone

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/checkpoint/snapshots"
	"github.com/cube-runtime/cube/checkpoint/store"
	"github.com/cube-runtime/cube/checkpoint/store/storetest"
	api "github.com/cube-runtime/cube/shim/snapshotapi"
)

// fakeShim writes a VM snapshot where the store says (storetest.Write).
type fakeShim struct{ err error }

func (f *fakeShim) Snapshot(ctx context.Context, r *api.SnapshotRequest) (*api.SnapshotResponse, error) {
	if f.err != nil {
		return nil, f.err
	}
	if err := storetest.Write(r.Dir, ""); err != nil {
		return nil, err
	}
	return &api.SnapshotResponse{Snapshot: &api.Snapshot{Dir: r.Dir, Id: r.Id}}, nil
}

func (f *fakeShim) List(ctx context.Context, r *api.ListRequest) (*api.ListResponse, error) {
	return &api.ListResponse{}, nil
}

// fakeMaker makes containers in a map; fail says which ids fail.
type fakeMaker struct {
	mu      sync.Mutex
	made    map[string]string // id -> snapshot dir
	labels  map[string]map[string]string
	removed []string
	fail    map[string]error
	// dirGone records, per Make, whether the snapshot dir existed.
	dirs []bool
}

func newMaker() *fakeMaker {
	return &fakeMaker{made: map[string]string{}, labels: map[string]map[string]string{}, fail: map[string]error{}}
}

func testRecord() Record {
	return Record{Version: RecordVersion, Container: "src", Namespace: "ns", Image: "docker.io/x/y:1", Snapshotter: "cube",
		Runtime: "io.cube.v1", Spec: json.RawMessage(`{"ociVersion":"1.2.0","process":{"args":["sh"]},"linux":{"cgroupsPath":"/ns/src"}}`)}
}

func (m *fakeMaker) Record(ctx context.Context, id string) (Record, error) {
	if id != "src" {
		return Record{}, fmt.Errorf("no container %s: %w", id, errdefs.ErrNotFound)
	}
	return testRecord(), nil
}

func (m *fakeMaker) Make(ctx context.Context, id string, rec Record, dir string, labels map[string]string) (uint32, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, err := os.Stat(filepath.Join(dir, "manifest.json"))
	m.dirs = append(m.dirs, err == nil)
	if err := m.fail[id]; err != nil {
		return 0, err
	}
	if _, ok := m.made[id]; ok {
		return 0, fmt.Errorf("container %s: %w", id, errdefs.ErrAlreadyExists)
	}
	m.made[id], m.labels[id] = dir, maps.Clone(labels)
	return uint32(os.Getpid()), nil // a live pid: the store's reference follows it
}

func (m *fakeMaker) DropLabel(ctx context.Context, id, label string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.made[id]; !ok {
		return fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	delete(m.labels[id], label)
	return nil
}

func (m *fakeMaker) Labelled(ctx context.Context, label string) (map[string]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]string{}
	for id := range m.made {
		if v := m.labels[id][label]; v != "" {
			out[id] = v
		}
	}
	return out, nil
}

func (m *fakeMaker) Remove(ctx context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.made, id)
	m.removed = append(m.removed, id)
	return nil
}

func openStore(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestRecordRoundTripAndRefusals(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadRecord(dir); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "no container record") {
		t.Errorf("no record: %v", err)
	}
	if err := WriteRecord(dir, testRecord()); err != nil {
		t.Fatal(err)
	}
	got, err := ReadRecord(dir)
	if err != nil || got.Image != "docker.io/x/y:1" || got.Runtime != "io.cube.v1" {
		t.Fatalf("%+v %v", got, err)
	}
	for _, bad := range []string{`{`, `{"version":2}`, `{"version":1,"image":"x","snapshotter":"s","runtime":"r"}`, strings.Repeat(" ", maxRecord+1)} {
		if _, err := parseRecord([]byte(bad)); !errdefs.IsDataLoss(err) {
			t.Errorf("record %.40q: %v, want data loss", bad, err)
		}
	}
}

func FuzzParseRecord(f *testing.F) {
	b, _ := json.Marshal(testRecord())
	f.Add(b)
	f.Add([]byte(`{"version":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseRecord(b)
		if err == nil && r.validate() != nil {
			t.Fatal("accepted an invalid record")
		}
	})
}

func TestCloneSpec(t *testing.T) {
	rec := testRecord()
	spec, err := cloneSpec(rec, "ns", "new")
	if err != nil || spec.Linux.CgroupsPath != "/ns/new" {
		t.Fatalf("%v %v", spec, err)
	}
	rec.Spec = json.RawMessage(`{"linux":{"cgroupsPath":"/kubepods/pod1/x"},"annotations":{"io.kubernetes.cri.sandbox-id":"p","keep":"1"}}`)
	spec, err = cloneSpec(rec, "ns", "new")
	if err != nil || spec.Linux.CgroupsPath != "" || len(spec.Annotations) != 1 || spec.Annotations["keep"] != "1" {
		t.Fatalf("%+v %v", spec, err)
	}
}

func TestRestore(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	snap := storetest.Take(t, st, store.BeginOptions{Sandbox: "ns/src", Names: []string{"s1"}}, false)
	m := newMaker()
	// No container record: refused, naming the cause.
	if _, err := Restore(ctx, st, m, "ns", "s1", "new"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("restore of a snapshot without a record: %v", err)
	}
	if err := WriteRecord(snap.Dir, testRecord()); err != nil {
		t.Fatal(err)
	}
	if _, err := Restore(ctx, st, m, "ns", "nosuch", "new"); !errdefs.IsNotFound(err) {
		t.Errorf("restore of a missing snapshot: %v", err)
	}
	m.fail["bad"] = errors.New("the shim refused")
	if _, err := Restore(ctx, st, m, "ns", "s1", "bad"); err == nil {
		t.Error("a failed make: no error")
	}
	// The failed restore left no reference: the snapshot could be deleted now.
	got, _ := st.Get(ctx, snap.ID)
	if len(got.Holders) != 0 {
		t.Errorf("references after a failed restore: %+v", got.Holders)
	}
	res, err := Restore(ctx, st, m, "ns", "s1", "new")
	if err != nil || res.ID != "new" || m.made["new"] != snap.Dir || m.labels["new"][LabelRestoredFrom] != snap.ID {
		t.Fatalf("restore: %+v %v (made %v)", res, err, m.made)
	}
	// The new sandbox holds the snapshot while its VMM (here: this process) lives.
	if err := st.Delete(ctx, snap.ID); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), snapshots.Holder("ns/new")) {
		t.Errorf("delete of a snapshot a restored VM maps: %v", err)
	}
}

func TestFork(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	m := newMaker()
	out, err := Fork(ctx, st, &fakeShim{}, m, ForkOptions{Container: "src", Sandbox: "ns/src", N: 3, Prefix: "c"})
	if err != nil || len(out.Clones) != 3 || out.Failed() != 0 {
		t.Fatalf("fork: %+v %v", out, err)
	}
	for i, c := range out.Clones {
		if c.ID != fmt.Sprintf("c-%d", i+1) || m.labels[c.ID][LabelFork] != out.Op || m.labels[c.ID][LabelForkedFrom] != "src" {
			t.Errorf("clone %d: %+v, labels %v", i, c, m.labels[c.ID])
		}
		if _, pending := m.labels[c.ID][LabelForkPending]; pending {
			t.Errorf("clone %s kept by the fork is still marked pending: %v", c.ID, m.labels[c.ID])
		}
	}
	for i, ok := range m.dirs {
		if !ok {
			t.Errorf("clone %d was made without the snapshot's directory", i+1)
		}
	}
	assertStoreEmpty(t, st, out.Snapshot)

	// Not all or nothing: the third fails, the others stay.
	m = newMaker()
	m.fail["d-2"] = errors.New("out of memory")
	out, err = Fork(ctx, st, &fakeShim{}, m, ForkOptions{Container: "src", Sandbox: "ns/src", N: 3, Prefix: "d"})
	if err == nil || out.Failed() != 1 || len(m.made) != 2 || out.Clones[1].Err == nil {
		t.Errorf("fork with a failing clone: %+v %v (made %v)", out, err, m.made)
	}
	assertStoreEmpty(t, st, out.Snapshot)

	// All or nothing: the third fails, the two made are removed, none is left.
	m = newMaker()
	m.fail["e-3"] = errors.New("restore refused")
	out, err = Fork(ctx, st, &fakeShim{}, m, ForkOptions{Container: "src", Sandbox: "ns/src", N: 4, Prefix: "e", AllOrNothing: true})
	if err == nil || !strings.Contains(err.Error(), "restore refused") || len(m.made) != 0 || strings.Join(m.removed, ",") != "e-1,e-2" {
		t.Errorf("all-or-nothing fork: %v (made %v, removed %v)", err, m.made, m.removed)
	}
	if len(out.Clones) != 3 || !out.Clones[0].Removed || !out.Clones[1].Removed || out.Clones[2].Err == nil {
		t.Errorf("all-or-nothing results: %+v", out.Clones)
	}
	assertStoreEmpty(t, st, out.Snapshot)

	// Refusals before anything is made.
	for _, o := range []ForkOptions{{Container: "src", N: 0, Prefix: "x"}, {Container: "src", N: MaxClones + 1, Prefix: "x"}, {Container: "src", N: 1}} {
		if _, err := Fork(ctx, st, &fakeShim{}, m, o); !errdefs.IsInvalidArgument(err) {
			t.Errorf("fork %+v: %v", o, err)
		}
	}
	if _, err := Fork(ctx, st, &fakeShim{}, m, ForkOptions{Container: "nope", N: 1, Prefix: "x"}); !errdefs.IsNotFound(err) {
		t.Errorf("fork of a missing container: %v", err)
	}
	// The source's snapshot fails: nothing made, nothing in the store.
	m = newMaker()
	if _, err := Fork(ctx, st, &fakeShim{err: errors.New("busy")}, m, ForkOptions{Container: "src", Sandbox: "ns/src", N: 2, Prefix: "f"}); err == nil || len(m.made) != 0 {
		t.Errorf("fork whose snapshot fails: %v (made %v)", err, m.made)
	}
	assertStoreEmpty(t, st, "")
}

// assertStoreEmpty: no snapshot (id, the fork's temporary one) or pending
// record is left.
func assertStoreEmpty(t *testing.T, st *store.Store, id string) {
	t.Helper()
	page, _, err := st.List(context.Background(), store.ListOptions{})
	if err != nil || len(page) != 0 {
		t.Errorf("store after the fork (snapshot %s): %+v %v", id, page, err)
	}
	if ents, _ := os.ReadDir(filepath.Join(st.Root(), "pending")); len(ents) != 0 {
		t.Errorf("pending records after the fork: %v", ents)
	}
}

// TestCollectAbandoned: clones still marked pending by a fork whose process
// is gone (or whose mark is garbage) are removed; a running fork's (this
// process's) are left alone; kept clones carry no mark.
func TestCollectAbandoned(t *testing.T) {
	ctx := context.Background()
	m := newMaker()
	live, err := pendingValue("fork-live")
	if err != nil {
		t.Fatal(err)
	}
	start, _ := processStart(os.Getpid())
	for id, v := range map[string]string{
		"live":     live,
		"dead":     "fork-dead/2147483646/1",
		"reused":   fmt.Sprintf("fork-reused/%d/%d", os.Getpid(), start+1), // this pid, another start: another process
		"garbage":  "nonsense",
		"finished": "",
	} {
		m.Make(ctx, id, testRecord(), t.TempDir(), map[string]string{LabelForkPending: v})
	}
	got, err := CollectAbandoned(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got.Removed)
	if strings.Join(got.Removed, ",") != "dead,garbage,reused" || len(got.Failed) != 0 {
		t.Errorf("collected %+v", got)
	}
	if _, ok := m.made["live"]; !ok {
		t.Error("a running fork's clone was removed")
	}
	if _, ok := m.made["finished"]; !ok {
		t.Error("a finished clone was removed")
	}
	if _, err := CollectAbandoned(ctx, struct{ Maker }{m}); err == nil {
		t.Error("a maker that cannot list was accepted")
	}
}

func TestProcessStart(t *testing.T) {
	a, err := processStart(os.Getpid())
	if err != nil || a == 0 {
		t.Fatalf("%d %v", a, err)
	}
	if b, _ := processStart(os.Getpid()); b != a {
		t.Errorf("start time changed: %d then %d", a, b)
	}
	if _, err := processStart(2147483646); err == nil {
		t.Error("a start time for a pid that does not exist")
	}
	if !forkAlive(fmt.Sprintf("op/%d/%d", os.Getpid(), a)) || forkAlive("op/x/1") || forkAlive("op/1") {
		t.Error("forkAlive")
	}
}
