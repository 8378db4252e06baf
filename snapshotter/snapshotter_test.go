package snapshotter

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/snapshotter/imagefile"
)

const testSize = 32 << 20

func testCtx() context.Context {
	return namespaces.WithNamespace(context.Background(), "test")
}

func needTools(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"mkfs.ext4", "debugfs", "e2fsck", "resize2fs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found: install e2fsprogs", tool)
		}
	}
}

func open(t *testing.T, root string, policy ReflinkPolicy) *Snapshotter {
	t.Helper()
	needTools(t)
	l := logrus.New()
	l.SetOutput(tWriter{t})
	s, err := New(testCtx(), Options{Root: root, DefaultSize: testSize, Reflink: policy, Log: logrus.NewEntry(l)})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// debugfs reads and writes files inside an image without mounting it (no root needed).
func debugfs(t *testing.T, img string, write bool, req string) string {
	t.Helper()
	args := []string{"-R", req, img}
	if write {
		args = append([]string{"-w"}, args...)
	}
	out, err := exec.Command("debugfs", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("debugfs %s: %v: %s", req, err, out)
	}
	return string(out)
}

func putFile(t *testing.T, img, name, content string) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(src, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	debugfs(t, img, true, "write "+src+" "+name)
}

func catFile(t *testing.T, img, name string) string {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", "cat "+name, img).Output()
	if err != nil {
		t.Fatalf("debugfs cat %s: %v", name, err)
	}
	return string(out)
}

func listImages(t *testing.T, s *Snapshotter) []string {
	t.Helper()
	var names []string
	for _, d := range []string{s.imgDir, s.tmpDir} {
		es, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			names = append(names, filepath.Join(filepath.Base(d), e.Name()))
		}
	}
	slices.Sort(names)
	return names
}

func TestLifecycleTransitions(t *testing.T) {
	ctx := testCtx()
	s := open(t, t.TempDir(), ReflinkAuto)

	m, err := s.Prepare(ctx, "base-active", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || m[0].Type != "ext4" || !slices.Equal(m[0].Options, []string{"loop", "rw", "noload"}) {
		t.Fatalf("prepare mounts = %+v, want one ext4 [loop rw noload]", m)
	}
	img := m[0].Source
	st, err := os.Stat(img)
	if err != nil || st.Size() != testSize {
		t.Fatalf("image %s: %v size %d, want %d", img, err, st.Size(), testSize)
	}
	if out := debugfs(t, img, false, "ls -l /"); strings.Contains(out, "lost+found") {
		t.Fatalf("fresh image has lost+found:\n%s", out)
	}
	info, err := s.Stat(ctx, "base-active")
	if err != nil || info.Kind != snapshots.KindActive {
		t.Fatalf("stat active: %+v %v", info, err)
	}
	putFile(t, img, "hello", "from base\n")

	if err := s.Commit(ctx, "base", "base-active"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stat(ctx, "base-active"); !errdefs.IsNotFound(err) {
		t.Fatalf("active key after commit: err %v, want not found", err)
	}
	if err := s.Commit(ctx, "again", "base"); !errdefs.IsNotFound(err) && !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("commit of a committed snapshot: %v", err)
	}
	info, err = s.Stat(ctx, "base")
	if err != nil || info.Kind != snapshots.KindCommitted || info.Parent != "" {
		t.Fatalf("stat committed: %+v %v", info, err)
	}
	u, err := s.Usage(ctx, "base")
	if err != nil || u.Size <= 0 || u.Inodes < 2 {
		t.Fatalf("usage committed = %+v, %v", u, err)
	}

	// Child: a clone (here a copy: /tmp is ext4) holding the parent's file, writable.
	m, err = s.Prepare(ctx, "child", "base")
	if err != nil {
		t.Fatal(err)
	}
	if m[0].Source == img || !slices.Equal(m[0].Options, []string{"loop", "rw", "noload"}) {
		t.Fatalf("child mounts %+v", m)
	}
	if got := catFile(t, m[0].Source, "hello"); got != "from base\n" {
		t.Fatalf("child sees %q", got)
	}
	putFile(t, m[0].Source, "mine", "child only\n")
	if got := catFile(t, img, "mine"); got != "" {
		t.Fatalf("write to child leaked into parent: %q", got)
	}

	// View: read-only, the parent's own file, no new file.
	before := listImages(t, s)
	m, err = s.View(ctx, "view", "base")
	if err != nil {
		t.Fatal(err)
	}
	if m[0].Source != img || !slices.Equal(m[0].Options, []string{"loop", "ro"}) {
		t.Fatalf("view mounts %+v, want %s ro", m, img)
	}
	if after := listImages(t, s); !slices.Equal(before, after) {
		t.Fatalf("view created files: %v -> %v", before, after)
	}
	if mm, err := s.Mounts(ctx, "view"); err != nil || mm[0].Source != img {
		t.Fatalf("Mounts(view) = %+v, %v", mm, err)
	}
	info, err = s.Stat(ctx, "view")
	if err != nil || info.Kind != snapshots.KindView || info.Parent != "base" {
		t.Fatalf("stat view %+v %v", info, err)
	}
	// A parentless view gets its own empty image.
	if m, err = s.View(ctx, "empty-view", ""); err != nil || !slices.Equal(m[0].Options, []string{"loop", "ro"}) {
		t.Fatalf("parentless view: %+v %v", m, err)
	}

	// The parent cannot go while it has children.
	if err := s.Remove(ctx, "base"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("remove parent with children: %v, want failed precondition", err)
	}
	// A view's parent must be committed; so must a Prepare's.
	if _, err := s.Prepare(ctx, "grandchild", "child"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("prepare on active parent: %v, want invalid argument", err)
	}
	for _, k := range []string{"view", "child", "empty-view", "base"} {
		if err := s.Remove(ctx, k); err != nil {
			t.Fatalf("remove %s: %v", k, err)
		}
	}
	if left := listImages(t, s); len(left) != 0 {
		t.Fatalf("files left after removing everything: %v", left)
	}
}

func TestUnknownKeys(t *testing.T) {
	ctx := testCtx()
	s := open(t, t.TempDir(), ReflinkAuto)
	if _, err := s.Stat(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Errorf("Stat: %v", err)
	}
	if _, err := s.Mounts(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Errorf("Mounts: %v", err)
	}
	if _, err := s.Usage(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Errorf("Usage: %v", err)
	}
	if err := s.Commit(ctx, "x", "nope"); !errdefs.IsNotFound(err) {
		t.Errorf("Commit: %v", err)
	}
	if err := s.Remove(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Errorf("Remove: %v", err)
	}
	if _, err := s.Update(ctx, snapshots.Info{Name: "nope", Labels: map[string]string{"a": "b"}}); !errdefs.IsNotFound(err) {
		t.Errorf("Update: %v", err)
	}
	if _, err := s.Prepare(ctx, "k", "nope"); !errdefs.IsNotFound(err) {
		t.Errorf("Prepare on unknown parent: %v", err)
	}
	if _, err := s.View(ctx, "k", "nope"); !errdefs.IsNotFound(err) {
		t.Errorf("View on unknown parent: %v", err)
	}
	if _, err := s.Prepare(ctx, "", ""); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Prepare with empty key: %v", err)
	}
	if _, err := s.Prepare(ctx, "k", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(ctx, "k", ""); !errdefs.IsAlreadyExists(err) {
		t.Errorf("Prepare twice: %v", err)
	}
	if left := listImages(t, s); len(left) != 1 {
		t.Errorf("failed calls left files: %v", left)
	}
}

func TestWalkFilters(t *testing.T) {
	ctx := testCtx()
	s := open(t, t.TempDir(), ReflinkAuto)
	mk := func(key, parent string, labels map[string]string, commit string) {
		t.Helper()
		if _, err := s.Prepare(ctx, key, parent, snapshots.WithLabels(labels)); err != nil {
			t.Fatal(err)
		}
		if commit != "" {
			if err := s.Commit(ctx, commit, key, snapshots.WithLabels(labels)); err != nil {
				t.Fatal(err)
			}
		}
	}
	mk("a-tmp", "", map[string]string{"tier": "base", "team": "x"}, "a")
	mk("b-tmp", "a", map[string]string{"tier": "app", "team": "x"}, "b")
	mk("c", "b", map[string]string{"tier": "app", "team": "y"}, "")
	if _, err := s.View(ctx, "v", "a", snapshots.WithLabels(map[string]string{"tier": "view"})); err != nil {
		t.Fatal(err)
	}
	walk := func(filters ...string) []string {
		t.Helper()
		var got []string
		if err := s.Walk(ctx, func(_ context.Context, i snapshots.Info) error {
			got = append(got, i.Name)
			return nil
		}, filters...); err != nil {
			t.Fatalf("walk %q: %v", filters, err)
		}
		slices.Sort(got)
		return got
	}
	for _, tc := range []struct {
		filters []string
		want    []string
	}{
		{nil, []string{"a", "b", "c", "v"}},
		{[]string{`labels.tier==app`}, []string{"b", "c"}},
		{[]string{`labels.tier==app,labels.team==x`}, []string{"b"}},          // and
		{[]string{`labels.tier==base`, `labels.team==y`}, []string{"a", "c"}}, // or
		{[]string{`kind==committed`}, []string{"a", "b"}},
		{[]string{`kind==active`}, []string{"c"}},
		{[]string{`kind==view`}, []string{"v"}},
		{[]string{`parent==a`}, []string{"b", "v"}},
		{[]string{`name~=^[ab]$`}, []string{"a", "b"}},
		{[]string{`labels.missing==1`}, nil},
	} {
		if got := walk(tc.filters...); !slices.Equal(got, tc.want) {
			t.Errorf("walk %q = %v, want %v", tc.filters, got, tc.want)
		}
	}
	if err := s.Walk(ctx, func(context.Context, snapshots.Info) error { return nil }, `labels.tier==`); err == nil || !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad filter: %v, want invalid argument", err)
	}

	// Update touches labels only.
	info, err := s.Update(ctx, snapshots.Info{Name: "a", Labels: map[string]string{"tier": "gold"}}, "labels.tier")
	if err != nil || info.Labels["tier"] != "gold" || info.Labels["team"] != "x" {
		t.Fatalf("update = %+v, %v", info, err)
	}
	if got := walk(`labels.tier==gold`); !slices.Equal(got, []string{"a"}) {
		t.Errorf("after update: %v", got)
	}
}

func TestCopyFallback(t *testing.T) {
	ctx := testCtx()
	root := t.TempDir()
	ok, err := imagefile.ProbeReflink(root)
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		t.Skipf("%s can reflink; the copy fallback is tested with reflink = never only", root)
	}
	needTools(t)
	if _, err := New(ctx, Options{Root: root, DefaultSize: testSize, Reflink: ReflinkRequired}); err == nil {
		t.Fatal("reflink = required started on a filesystem without reflink")
	}
	s := open(t, root, ReflinkAuto)
	if s.Mode() != imagefile.ModeCopy {
		t.Fatalf("mode %s, want copy", s.Mode())
	}
	m, err := s.Prepare(ctx, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	putFile(t, m[0].Source, "data", strings.Repeat("x", 1<<20))
	if err := s.Commit(ctx, "base", "p"); err != nil {
		t.Fatal(err)
	}
	m, err = s.Prepare(ctx, "c", "base")
	if err != nil {
		t.Fatal(err)
	}
	if got := catFile(t, m[0].Source, "data"); len(got) != 1<<20 {
		t.Fatalf("copied child has %d bytes of data", len(got))
	}
	// The copy keeps holes: it occupies about what the parent does, not 32 MiB.
	pa, _ := imagefile.Allocated(s.imagePath("1"))
	ca, _ := imagefile.Allocated(m[0].Source)
	if ca > pa+(1<<20) || ca >= testSize {
		t.Fatalf("copy allocated %d bytes, parent %d: holes not kept", ca, pa)
	}
	u, err := s.Usage(ctx, "c")
	if err != nil || u.Size < 1<<20 {
		t.Fatalf("copy usage %+v %v: a copy owns its data", u, err)
	}
}

func TestSizeLabels(t *testing.T) {
	ctx := testCtx()
	s := open(t, t.TempDir(), ReflinkAuto)
	m, err := s.Prepare(ctx, "p", "", snapshots.WithLabels(map[string]string{LabelSize: "20MiB"}))
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(m[0].Source); st.Size() != 20<<20 {
		t.Fatalf("labelled image size %d", st.Size())
	}
	putFile(t, m[0].Source, "keep", "me\n")
	if err := s.Commit(ctx, "base", "p"); err != nil {
		t.Fatal(err)
	}
	m, err = s.Prepare(ctx, "big", "base", snapshots.WithLabels(map[string]string{LabelSize: "48M"}))
	if err != nil {
		t.Fatal(err)
	}
	sb, err := imagefile.ReadSuperblock(m[0].Source)
	if err != nil {
		t.Fatal(err)
	}
	if got := int64(sb.BlocksCount) * int64(sb.BlockSize); got != 48<<20 {
		t.Fatalf("grown filesystem is %d bytes, want %d", got, 48<<20)
	}
	if got := catFile(t, m[0].Source, "keep"); got != "me\n" {
		t.Fatalf("grown image lost data: %q", got)
	}
	if _, err := s.Prepare(ctx, "small", "base", snapshots.WithLabels(map[string]string{LabelSize: "16M"})); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("shrink: %v, want invalid argument", err)
	}
	if _, err := s.Prepare(ctx, "bad", "", snapshots.WithLabels(map[string]string{LabelSize: "lots"})); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad label: %v, want invalid argument", err)
	}
	m, err = s.Prepare(ctx, "generic", "", snapshots.WithLabels(map[string]string{snapshots.LabelSnapshotMaxSize: "25165824"}))
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(m[0].Source); st.Size() != 24<<20 {
		t.Fatalf("max-size label: image size %d", st.Size())
	}
	if left := listImages(t, s); len(left) != 3 {
		t.Fatalf("images after failed prepares: %v", left)
	}
}

// TestOrphanCleanup plays the aftermath of a crash: a half-built image in
// tmp/, an image renamed into place whose record never committed, and a removed
// image whose unlink never happened. Reopening must delete exactly those.
func TestOrphanCleanup(t *testing.T) {
	ctx := testCtx()
	root := t.TempDir()
	s := open(t, root, ReflinkAuto)
	if _, err := s.Prepare(ctx, "p", ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, "base", "p"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(ctx, "live", "base"); err != nil {
		t.Fatal(err)
	}
	want := listImages(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"tmp/new-123.img", "snapshots/99.img", "snapshots/rm-7.img", "snapshots/junk"} {
		if err := os.WriteFile(filepath.Join(root, p), []byte("half"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s = open(t, root, ReflinkAuto)
	if got := listImages(t, s); !slices.Equal(got, want) {
		t.Fatalf("after restart: %v, want %v", got, want)
	}
	if _, err := s.Stat(ctx, "live"); err != nil {
		t.Fatalf("live snapshot lost: %v", err)
	}
	// GC's Cleanup removes orphans too, while running, but not a live
	// snapshot's image being replaced (a restore's disk clone in flight).
	var liveTemp string
	for _, n := range want {
		if id, ok := strings.CutSuffix(strings.TrimPrefix(n, "snapshots/"), ".img"); ok && liveTemp == "" {
			liveTemp = "." + id + ".img.tmp-123"
		}
	}
	for _, n := range []string{"42.img", liveTemp, ".42.img.tmp-9"} {
		if err := os.WriteFile(filepath.Join(root, "snapshots", n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	want = append(want, "snapshots/"+liveTemp)
	slices.Sort(want)
	if got := listImages(t, s); !slices.Equal(got, want) {
		t.Fatalf("after Cleanup: %v, want %v", got, want)
	}
}

func TestCloseTwiceAndUseAfterClose(t *testing.T) {
	s := open(t, t.TempDir(), ReflinkAuto)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := s.Prepare(testCtx(), "k", ""); err == nil {
		t.Fatal("prepare after close succeeded")
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	ctx := testCtx()
	for _, o := range []Options{
		{DefaultSize: testSize},
		{Root: t.TempDir(), DefaultSize: 1},
		{Root: t.TempDir(), DefaultSize: testSize, Reflink: "sometimes"},
	} {
		if s, err := New(ctx, o); err == nil {
			s.Close()
			t.Errorf("New(%+v) succeeded", o)
		}
	}
}
