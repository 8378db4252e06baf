package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/cube-runtime/cube/guest-agent/protocol"
)

// TestFileRPCs: stat, list, remove and make a directory, through ttrpc,
// in the guest's own root (no container: a temporary directory of the
// machine stands for the guest's files). TestFilesInsideContainerRoot
// covers the resolution in a container's root.
func TestFileRPCs(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "d/sub"), 0o755)
	os.WriteFile(filepath.Join(dir, "d/a.txt"), []byte("hello"), 0o640)
	os.WriteFile(filepath.Join(dir, "d/sub/x"), []byte("x"), 0o644)
	os.Symlink("/etc/passwd", filepath.Join(dir, "d/link"))
	odd := "b\xff\n name"
	os.WriteFile(filepath.Join(dir, "d", odd), nil, 0o600)

	st, err := h.client.StatFile(ctx, &protocol.StatFileRequest{Path: dir + "/d/a.txt"})
	if err != nil || st.Stat.Type != "file" || st.Stat.Size != 5 || st.Stat.Mode != 0o640 || string(st.Stat.Name) != "a.txt" || st.Stat.ModTimeUnixNano == 0 {
		t.Fatalf("stat: %+v %v", st, err)
	}
	st, err = h.client.StatFile(ctx, &protocol.StatFileRequest{Path: dir + "/d/link"})
	if err != nil || st.Stat.Type != "symlink" || string(st.Stat.SymlinkTarget) != "/etc/passwd" {
		t.Fatalf("stat of a symlink (not followed): %+v %v", st, err)
	}
	_, err = h.client.StatFile(ctx, &protocol.StatFileRequest{Path: dir + "/nope"})
	wantCode(t, err, codes.NotFound, "stat "+dir+"/nope")
	_, err = h.client.StatFile(ctx, &protocol.StatFileRequest{Path: "rel"})
	wantCode(t, err, codes.InvalidArgument, "must be absolute")

	l, err := h.client.ListDir(ctx, &protocol.ListDirRequest{Path: dir + "/d"})
	var names []string
	for _, e := range l.GetEntries() {
		names = append(names, string(e.Name)+":"+e.Type)
	}
	if err != nil || fmt.Sprint(names) != fmt.Sprint([]string{"a.txt:file", odd + ":file", "link:symlink", "sub:dir"}) || l.More {
		t.Fatalf("list: %q %v", names, err)
	}
	// Pages: one entry at a time, after the last name.
	var after []byte
	var paged []string
	for i := 0; i < 10; i++ {
		l, err := h.client.ListDir(ctx, &protocol.ListDirRequest{Path: dir + "/d", After: after, Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range l.Entries {
			paged = append(paged, string(e.Name))
			after = e.Name
		}
		if !l.More {
			break
		}
	}
	if fmt.Sprint(paged) != fmt.Sprint([]string{"a.txt", odd, "link", "sub"}) {
		t.Errorf("paged: %q", paged)
	}
	_, err = h.client.ListDir(ctx, &protocol.ListDirRequest{Path: dir + "/d/a.txt"})
	wantCode(t, err, codes.InvalidArgument, "list")

	m, err := h.client.MakeDir(ctx, &protocol.MakeDirRequest{Path: dir + "/new/deep/er", Mode: 0o700})
	if fi, serr := os.Stat(filepath.Join(dir, "new/deep/er")); err != nil || !m.Created || serr != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("make dir: %+v %v %v", m, err, serr)
	}
	if m, err := h.client.MakeDir(ctx, &protocol.MakeDirRequest{Path: dir + "/new/deep/er"}); err != nil || m.Created {
		t.Errorf("make an existing dir: %+v %v", m, err)
	}
	_, err = h.client.MakeDir(ctx, &protocol.MakeDirRequest{Path: dir + "/d/a.txt"})
	wantCode(t, err, codes.AlreadyExists, "a file is there")

	_, err = h.client.RemoveFile(ctx, &protocol.RemoveFileRequest{Path: dir + "/d/sub"})
	wantCode(t, err, codes.FailedPrecondition, "not empty")
	// The symlink goes, not its target.
	if _, err := h.client.RemoveFile(ctx, &protocol.RemoveFileRequest{Path: dir + "/d/link"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Fatalf("the symlink's target: %v", err)
	}
	if _, err := h.client.RemoveFile(ctx, &protocol.RemoveFileRequest{Path: dir + "/d", Recursive: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "d")); !os.IsNotExist(err) {
		t.Errorf("removed recursively: %v", err)
	}
	_, err = h.client.RemoveFile(ctx, &protocol.RemoveFileRequest{Path: dir + "/d"})
	wantCode(t, err, codes.NotFound, "remove")
	_, err = h.client.RemoveFile(ctx, &protocol.RemoveFileRequest{Path: "/"})
	wantCode(t, err, codes.InvalidArgument, "names no file")
}
