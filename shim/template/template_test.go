package template

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// fixture is a shape whose files exist under a temp dir, and a Cache whose
// builder writes a fake snapshot and counts its builds.
type fixture struct {
	shape  Shape
	cache  func() *Cache
	builds atomic.Int32
	fail   atomic.Bool
	delay  time.Duration
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	f := &fixture{}
	for _, n := range []string{"vmm", "kernel", "initrd"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(n+" bytes"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f.shape = Shape{VMM: filepath.Join(dir, "vmm"), Kernel: filepath.Join(dir, "kernel"), Initrd: filepath.Join(dir, "initrd"),
		Cmdline: "console=ttyS0", MemoryMiB: 256, VCPUs: 1, DiskSlots: 8}
	root := filepath.Join(dir, "templates")
	f.cache = func() *Cache {
		return &Cache{Root: root, Wait: 10 * time.Second, Build: func(ctx context.Context, s Shape, work, snap string) error {
			f.builds.Add(1)
			time.Sleep(f.delay)
			if f.fail.Load() {
				return errors.New("guest agent never answered")
			}
			if err := os.MkdirAll(snap, 0o700); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(snap, "manifest"), []byte(fmt.Sprint(s.MemoryMiB)), 0o600)
		}}
	}
	return f
}

func TestGetBuildsOnceAndReuses(t *testing.T) {
	f := newFixture(t)
	f.delay = 200 * time.Millisecond
	// Many shims (each its own Cache, as separate processes have) at once.
	var wg sync.WaitGroup
	dirs := make([]string, 6)
	errs := make([]error, 6)
	for i := range dirs {
		wg.Add(1)
		go func() { defer wg.Done(); dirs[i], errs[i] = f.cache().Get(context.Background(), f.shape) }()
	}
	wg.Wait()
	for i := range dirs {
		if errs[i] != nil || dirs[i] != dirs[0] {
			t.Fatalf("get %d: %q %v (first %q)", i, dirs[i], errs[i], dirs[0])
		}
	}
	if n := f.builds.Load(); n != 1 {
		t.Fatalf("%d builds, want 1", n)
	}
	if _, err := os.Stat(filepath.Join(dirs[0], "manifest")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cache().Get(context.Background(), f.shape); err != nil || f.builds.Load() != 1 {
		t.Fatalf("reuse: %v, %d builds", err, f.builds.Load())
	}
	l, err := List(f.cache().Root)
	if err != nil || len(l) != 1 || l[0].Meta.Shape != f.shape || l[0].Meta.Digests["initrd"] == "" || l[0].Bytes == 0 {
		t.Fatalf("list: %+v %v", l, err)
	}
	// Nothing of the builds is left beside the template but its lock.
	ents, _ := os.ReadDir(f.cache().Root)
	for _, e := range ents {
		if n := e.Name(); n != l[0].Key && n != l[0].Key+".lock" && n != ".digests" {
			t.Errorf("left in the template dir: %s", n)
		}
	}
}

func TestKeyFollowsEveryInput(t *testing.T) {
	f := newFixture(t)
	c := f.cache()
	k0, _, err := c.Key(f.shape)
	if err != nil {
		t.Fatal(err)
	}
	if k, _, _ := c.Key(f.shape); k != k0 {
		t.Fatal("key not stable")
	}
	changed := map[string]Shape{}
	s := f.shape
	s.MemoryMiB = 512
	changed["memory"] = s
	s = f.shape
	s.VCPUs = 2
	changed["vcpus"] = s
	s = f.shape
	s.DiskSlots = 4
	changed["slots"] = s
	s = f.shape
	s.Cmdline += " quiet"
	changed["cmdline"] = s
	s = f.shape
	s.NICs = 1
	changed["nics"] = s
	for what, s := range changed {
		if k, _, _ := c.Key(s); k == k0 {
			t.Errorf("%s changed, key did not", what)
		}
	}
	// Content, not names: an initrd rewritten in place (same size, so only
	// mtime/ctime tell) and a kernel replaced by rename.
	time.Sleep(10 * time.Millisecond)
	if err := os.WriteFile(f.shape.Initrd, []byte("INITRD bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	k1, m1, err := c.Key(f.shape)
	if err != nil || k1 == k0 {
		t.Fatalf("initrd rewritten: key %s (was %s) %v", k1, k0, err)
	}
	tmp := f.shape.Kernel + ".new"
	os.WriteFile(tmp, []byte("kernel v2"), 0o644)
	if err := os.Rename(tmp, f.shape.Kernel); err != nil {
		t.Fatal(err)
	}
	if k2, m2, _ := c.Key(f.shape); k2 == k1 || m2.Digests["kernel"] == m1.Digests["kernel"] {
		t.Fatal("kernel replaced, key did not change")
	}
	if _, _, err := c.Key(Shape{VMM: "no-such-cube-vmm", Kernel: f.shape.Kernel}); err == nil {
		t.Fatal("missing vmm binary: no error")
	}
}

func TestFailedBuildRemembered(t *testing.T) {
	f := newFixture(t)
	f.fail.Store(true)
	_, err := f.cache().Get(context.Background(), f.shape)
	if err == nil || !strings.Contains(err.Error(), "guest agent never answered") {
		t.Fatalf("failed build: %v", err)
	}
	// The next sandbox does not retry: it is told why at once.
	f.fail.Store(false)
	_, err = f.cache().Get(context.Background(), f.shape)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "guest agent never answered") || f.builds.Load() != 1 {
		t.Fatalf("within FailTTL: %v (%d builds)", err, f.builds.Load())
	}
	l, _ := List(f.cache().Root)
	if len(l) != 1 || !strings.Contains(l[0].Failed, "never answered") {
		t.Fatalf("list: %+v", l)
	}
	// Past FailTTL it is built again.
	key, _, _ := f.cache().Key(f.shape)
	old := time.Now().Add(-FailTTL - time.Minute)
	os.Chtimes(filepath.Join(f.cache().Root, key+".failed"), old, old)
	if _, err := f.cache().Get(context.Background(), f.shape); err != nil || f.builds.Load() != 2 {
		t.Fatalf("after FailTTL: %v (%d builds)", err, f.builds.Load())
	}
	if l, _ := List(f.cache().Root); len(l) != 1 || l[0].Failed != "" {
		t.Fatalf("list after the rebuild: %+v", l)
	}
}

// holdLock takes key's build lock as another shim would.
func holdLock(t *testing.T, c *Cache, key string) func() {
	t.Helper()
	os.MkdirAll(c.Root, 0o700)
	fd, err := os.OpenFile(c.lockPath(key), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(fd.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	return func() { fd.Close() }
}

func TestWaitBoundedThenColdBoot(t *testing.T) {
	f := newFixture(t)
	c := f.cache()
	c.Wait = 100 * time.Millisecond
	key, _, _ := c.Key(f.shape)
	release := holdLock(t, c, key)
	defer release()
	_, err := c.Get(context.Background(), f.shape)
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "template_wait") || f.builds.Load() != 0 {
		t.Fatalf("busy build: %v (%d builds)", err, f.builds.Load())
	}
}

func TestRemove(t *testing.T) {
	f := newFixture(t)
	c := f.cache()
	dir, err := c.Get(context.Background(), f.shape)
	if err != nil {
		t.Fatal(err)
	}
	key, _, _ := c.Key(f.shape)
	release := holdLock(t, c, key)
	if err := Remove(c.Root, key); !errdefs.IsUnavailable(err) {
		t.Fatalf("remove during a build: %v", err)
	}
	release()
	for _, bad := range []string{"", "../x", ".digests"} {
		if err := Remove(c.Root, bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("remove %q: %v", bad, err)
		}
	}
	if err := Remove(c.Root, key); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("template still there: %v", err)
	}
	if err := Remove(c.Root, key); !errdefs.IsNotFound(err) {
		t.Fatalf("remove again: %v", err)
	}
	// Made again on the next use.
	if _, err := c.Get(context.Background(), f.shape); err != nil || f.builds.Load() != 2 {
		t.Fatalf("after rm: %v (%d builds)", err, f.builds.Load())
	}
}

// The first Key of a fresh root caches its digests (the next shim does not
// hash the files again), and a Key that fails on a missing file leaves no
// root behind.
func TestKeyCachesDigestsFromTheFirstCall(t *testing.T) {
	f := newFixture(t)
	c := f.cache()
	bad := f.shape
	bad.Initrd = bad.Initrd + ".missing"
	if _, _, err := c.Key(bad); err == nil {
		t.Fatal("missing initrd: no error")
	}
	if _, err := os.Stat(c.Root); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a failed Key left the template root: %v", err)
	}
	_, m, err := c.Key(f.shape)
	if err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(filepath.Join(c.Root, ".digests"))
	if err != nil || len(ents) != 3 {
		t.Fatalf("digest cache after the first Key: %d entries, %v", len(ents), err)
	}
	// A hit is the cached digest, not the file's: plant one and see it used.
	planted := strings.Repeat("ab", 32)
	for _, e := range ents {
		p := filepath.Join(c.Root, ".digests", e.Name())
		b, _ := os.ReadFile(p)
		line := strings.Replace(string(b), m.Digests["kernel"], planted, 1)
		os.WriteFile(p, []byte(line), 0o600)
	}
	if _, m2, _ := c.Key(f.shape); m2.Digests["kernel"] != planted {
		t.Fatalf("second Key hashed the kernel again (%s), not the cached digest", m2.Digests["kernel"])
	}
}
