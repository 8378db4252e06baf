package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cube-runtime/cube/guest-agent/protocol"
)

// kubeletTree is a configMap volume as the kubelet's atomic writer lays it
// out: a timestamped directory, "..data" pointing at it, a link per key.
func kubeletTree(stamp string, kv map[string]string) []*protocol.TreeEntry {
	ts := "..2026_12_05_08_00_00." + stamp
	es := []*protocol.TreeEntry{
		{Path: ts, Kind: protocol.TreeEntry_DIR, Mode: 0o755},
		{Path: "..data", Kind: protocol.TreeEntry_SYMLINK, Target: ts},
	}
	for k, v := range kv {
		es = append(es,
			&protocol.TreeEntry{Path: ts + "/" + k, Kind: protocol.TreeEntry_FILE, Mode: 0o644, Data: []byte(v)},
			&protocol.TreeEntry{Path: k, Kind: protocol.TreeEntry_SYMLINK, Target: "..data/" + k})
	}
	return es
}

func treeHarness(t *testing.T) (*harness, string, string) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: SyncTree sets file owners, PrepareVolume mounts")
	}
	vol, run := t.TempDir(), t.TempDir()
	h := newHarness(t, func(c *Config) { c.VolumeRoot = vol; c.RunRoot = run })
	return h, vol, run
}

func syncTree(t *testing.T, h *harness, dir string, es []*protocol.TreeEntry) *protocol.SyncTreeResponse {
	t.Helper()
	r, err := h.client.SyncTree(context.Background(), &protocol.SyncTreeRequest{Dir: dir, Mode: 0o755, Entries: es})
	if err != nil {
		t.Fatalf("SyncTree: %v", err)
	}
	return r
}

func readVol(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			out[rel] = "-> " + l
		case fi.IsDir():
			out[rel] = fmt.Sprintf("dir %o", fi.Mode().Perm())
		default:
			b, _ := os.ReadFile(p)
			out[rel] = fmt.Sprintf("%o %s", fi.Mode().Perm(), b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSyncTreeKubeletSwap(t *testing.T) {
	h, vol, _ := treeHarness(t)
	dir := filepath.Join(vol, "configmap", "cfg")
	r := syncTree(t, h, dir, kubeletTree("1", map[string]string{"a": "one", "b": "bee"}))
	if r.Written != 6 || r.Removed != 0 {
		t.Errorf("first sync: written %d removed %d, want 6 and 0", r.Written, r.Removed)
	}
	got := readVol(t, dir)
	want := map[string]string{
		"..2026_12_05_08_00_00.1": "dir 755", "..2026_12_05_08_00_00.1/a": "644 one", "..2026_12_05_08_00_00.1/b": "644 bee",
		"..data": "-> ..2026_12_05_08_00_00.1", "a": "-> ..data/a", "b": "-> ..data/b",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("tree after first sync:\n got %v\nwant %v", got, want)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "a")); err != nil || string(b) != "one" {
		t.Fatalf("read a through the links: %q %v", b, err)
	}
	if r := syncTree(t, h, dir, kubeletTree("1", map[string]string{"a": "one", "b": "bee"})); r.Written != 0 || r.Removed != 0 {
		t.Errorf("same tree again: written %d removed %d, want nothing", r.Written, r.Removed)
	}
	// The swap: a new timestamped dir, b gone, c new.
	r = syncTree(t, h, dir, kubeletTree("2", map[string]string{"a": "two", "c": "sea"}))
	got = readVol(t, dir)
	want = map[string]string{
		"..2026_12_05_08_00_00.2": "dir 755", "..2026_12_05_08_00_00.2/a": "644 two", "..2026_12_05_08_00_00.2/c": "644 sea",
		"..data": "-> ..2026_12_05_08_00_00.2", "a": "-> ..data/a", "c": "-> ..data/c",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("tree after the swap:\n got %v\nwant %v", got, want)
	}
	if r.Removed != 4 { // old dir, its two files, link b
		t.Errorf("swap removed %d entries, want 4", r.Removed)
	}
}

// A reader of a key through the links sees one whole version or the other
// while the tree is swapped under it, never a partial file. (As with the
// kubelet's own swap, a reader that resolved "..data" to the old directory
// just before it is removed gets ENOENT: that is retried here.)
func TestSyncTreeReadersSeeWholeVersions(t *testing.T) {
	h, vol, _ := treeHarness(t)
	dir := filepath.Join(vol, "projected", "token")
	big := func(c byte) string { return strings.Repeat(string(c), 256<<10) }
	syncTree(t, h, dir, kubeletTree("0", map[string]string{"token": big('a')}))
	var stop atomic.Bool
	var bad atomic.Value
	var reads atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			b, err := os.ReadFile(filepath.Join(dir, "token"))
			reads.Add(1)
			if os.IsNotExist(err) {
				continue
			}
			if err != nil {
				bad.Store(err.Error())
				return
			}
			if len(b) != 256<<10 || strings.Count(string(b), string(b[0])) != len(b) {
				bad.Store(fmt.Sprintf("partial read: %d bytes", len(b)))
				return
			}
		}
	}()
	for i := 1; i <= 40; i++ {
		syncTree(t, h, dir, kubeletTree(fmt.Sprint(i), map[string]string{"token": big(byte('a' + i%26))}))
	}
	stop.Store(true)
	wg.Wait()
	if v := bad.Load(); v != nil {
		t.Fatalf("a reader saw %v after %d reads", v, reads.Load())
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "token")); len(b) == 0 || b[0] != byte('a'+40%26) {
		t.Fatalf("token after the last swap starts %q", b[:min(len(b), 4)])
	}
}

// Whatever is in the guest directory, the sync replaces it without
// following a link: a link where a directory is wanted is replaced, and the
// directory it pointed at is untouched.
func TestSyncTreeDoesNotFollowGuestLinks(t *testing.T) {
	h, vol, _ := treeHarness(t)
	dir := filepath.Join(vol, "secret", "s")
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "victim"), []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "sub")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "victim"), filepath.Join(dir, "f")); err != nil {
		t.Fatal(err)
	}
	syncTree(t, h, dir, []*protocol.TreeEntry{
		{Path: "sub", Kind: protocol.TreeEntry_DIR, Mode: 0o755},
		{Path: "sub/victim", Kind: protocol.TreeEntry_FILE, Mode: 0o600, Data: []byte("new")},
		{Path: "f", Kind: protocol.TreeEntry_FILE, Mode: 0o600, Data: []byte("new")},
	})
	if b, _ := os.ReadFile(filepath.Join(outside, "victim")); string(b) != "keep" {
		t.Fatalf("the file outside the tree became %q", b)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "sub")); err != nil || !fi.IsDir() {
		t.Fatalf("sub is not a directory: %v %v", fi, err)
	}
	// A link in the path of dir itself is refused.
	if err := os.Symlink(outside, filepath.Join(vol, "evil")); err != nil {
		t.Fatal(err)
	}
	_, err := h.client.SyncTree(context.Background(), &protocol.SyncTreeRequest{Dir: filepath.Join(vol, "evil", "x")})
	if err == nil {
		t.Fatal("SyncTree through a link in dir's path succeeded")
	}
	if _, err := os.Stat(filepath.Join(outside, "x")); err == nil {
		t.Fatal("SyncTree made a directory through a link")
	}
}

func TestSyncTreeRefuses(t *testing.T) {
	h, vol, _ := treeHarness(t)
	dir := filepath.Join(vol, "configmap", "c")
	file := func(p string, n int) *protocol.TreeEntry {
		return &protocol.TreeEntry{Path: p, Kind: protocol.TreeEntry_FILE, Data: make([]byte, n)}
	}
	link := func(p, tgt string) *protocol.TreeEntry {
		return &protocol.TreeEntry{Path: p, Kind: protocol.TreeEntry_SYMLINK, Target: tgt}
	}
	for name, tc := range map[string]struct {
		dir  string
		es   []*protocol.TreeEntry
		want string
	}{
		"dir outside":      {dir: "/etc/x", want: "not under"},
		"dir unclean":      {dir: vol + "/a/../b", want: "not clean"},
		"dir is the root":  {dir: vol, want: "not under"},
		"dotdot path":      {es: []*protocol.TreeEntry{file("../x", 1)}, want: `".."`},
		"absolute path":    {es: []*protocol.TreeEntry{file("/x", 1)}, want: "empty"},
		"absolute link":    {es: []*protocol.TreeEntry{link("l", "/etc/shadow")}, want: "leaves the tree"},
		"climbing link":    {es: []*protocol.TreeEntry{{Path: "d", Kind: protocol.TreeEntry_DIR}, link("d/l", "../../x")}, want: "leaves the tree"},
		"no parent":        {es: []*protocol.TreeEntry{file("d/x", 1)}, want: "not a listed directory"},
		"parent is a file": {es: []*protocol.TreeEntry{file("d", 1), file("d/x", 1)}, want: "not a listed directory"},
		"twice":            {es: []*protocol.TreeEntry{file("x", 1), file("x", 1)}, want: "twice"},
		"too much data":    {es: []*protocol.TreeEntry{file("x", protocol.MaxTreeBytes), file("y", 1)}, want: "bytes of file data"},
		"agent's names":    {es: []*protocol.TreeEntry{file(tmpPrefix+"1", 1)}, want: "agent's own"},
		"data on a link":   {es: []*protocol.TreeEntry{{Path: "l", Kind: protocol.TreeEntry_SYMLINK, Target: "x", Data: []byte("x")}}, want: "data on"},
	} {
		t.Run(name, func(t *testing.T) {
			d := tc.dir
			if d == "" {
				d = dir
			}
			_, err := h.client.SyncTree(context.Background(), &protocol.SyncTreeRequest{Dir: d, Entries: tc.es})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want InvalidArgument with %q", err, tc.want)
			}
		})
	}
	if _, err := os.Stat(dir); err == nil {
		t.Error("a refused request made its directory")
	}
}

func TestPrepareVolume(t *testing.T) {
	h, _, run := treeHarness(t)
	ctx := context.Background()
	plain := filepath.Join(run, "disks", "d0", ".cube-volumes", "empty-dir", "cache")
	if _, err := h.client.PrepareVolume(ctx, &protocol.PrepareVolumeRequest{Path: plain}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(plain); err != nil || fi.Mode().Perm() != 0o777 {
		t.Fatalf("plain volume: %v %v, want a 0777 directory", fi, err)
	}
	mem := filepath.Join(run, "volumes", "empty-dir", "mem")
	req := &protocol.PrepareVolumeRequest{Path: mem, Tmpfs: true, TmpfsSizeBytes: 8 << 20}
	if _, err := h.client.PrepareVolume(ctx, req); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mem, unix.MNT_DETACH) })
	// Idempotent: a second call (a second container) mounts nothing more.
	if _, err := h.client.PrepareVolume(ctx, req); err != nil {
		t.Fatal(err)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(mem, &sfs); err != nil {
		t.Fatal(err)
	}
	if sfs.Type != unix.TMPFS_MAGIC || uint64(sfs.Blocks)*uint64(sfs.Bsize) != 8<<20 {
		t.Fatalf("memory volume: fs type %#x, %d bytes; want tmpfs of 8 MiB", sfs.Type, uint64(sfs.Blocks)*uint64(sfs.Bsize))
	}
	if err := unix.Unmount(mem, 0); err != nil {
		t.Fatalf("unmount: %v", err)
	}
	if err := unix.Unmount(mem, 0); err == nil {
		t.Fatal("the second PrepareVolume mounted another tmpfs")
	}
	if _, err := h.client.PrepareVolume(ctx, &protocol.PrepareVolumeRequest{Path: "/etc/x"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a path outside the run root: %v, want InvalidArgument", err)
	}
}

// A virtio-fs share request is refused with a tmpfs or an over-long tag;
// a tag that names no device fails the mount with the tag in the error.
func TestPrepareVolumeVirtiofsRefusals(t *testing.T) {
	h, _, run := treeHarness(t)
	ctx := context.Background()
	p := filepath.Join(run, "shared")
	for name, req := range map[string]*protocol.PrepareVolumeRequest{
		"with tmpfs": {Path: p, VirtiofsTag: "cube-vol", Tmpfs: true},
		"long tag":   {Path: p, VirtiofsTag: strings.Repeat("t", 37)},
	} {
		if _, err := h.client.PrepareVolume(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	if os.Geteuid() != 0 {
		return // mounting needs root; the refusals above do not
	}
	_, err := h.client.PrepareVolume(ctx, &protocol.PrepareVolumeRequest{Path: p, VirtiofsTag: "no-such-tag-here"})
	if err == nil || !strings.Contains(err.Error(), "no-such-tag-here") {
		t.Errorf("mount of an absent share: %v, want an error naming the tag", err)
	}
}
