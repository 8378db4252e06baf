package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// A host directory bound into the share is seen there (read-only when
// asked, on the host side too), and releasing the share unbinds it
// without touching the host directory's files.
func TestShareBindAndRelease(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to bind-mount (the root tier runs it)")
	}
	state, src := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(src, "f"), []byte("host"), 0o644)
	sd := filepath.Join(state, ShareDirName)
	if err := os.Mkdir(sd, 0o700); err != nil {
		t.Fatal(err)
	}
	rw, ro := filepath.Join(sd, "v1"), filepath.Join(sd, "v2")
	if err := bindHostDir(src, rw, false); err != nil {
		t.Fatal(err)
	}
	if err := bindHostDir(src, ro, true); err != nil {
		_ = ReleaseShareDir(state)
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(rw, "f")); err != nil || string(b) != "host" {
		t.Errorf("through the bind: %q %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(ro, "new"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write through the read-only bind: %v, want EROFS", err)
	}
	if err := os.WriteFile(filepath.Join(rw, "new"), []byte("g"), 0o644); err != nil {
		t.Errorf("write through the bind: %v", err)
	}
	if err := bindHostDir(filepath.Join(src, "f"), filepath.Join(sd, "v3"), false); err == nil {
		t.Error("a regular file was bound as a shared directory")
	}
	if err := ReleaseShareDir(state); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sd); !os.IsNotExist(err) {
		t.Errorf("share dir still there: %v", err)
	}
	for _, f := range []string{"f", "new"} {
		if _, err := os.Stat(filepath.Join(src, f)); err != nil {
			t.Errorf("host file after release: %v", err)
		}
	}
}

// A restore binds the new container's host directories at the share
// entries the snapshot recorded: a recorded one the new spec lacks is
// FailedPrecondition naming it and the fix; given, it is bound at the same
// entry, listed, and later entries continue after it.
func TestRestoreRebindsShares(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to bind-mount (the root tier runs it)")
	}
	snap, state, src := t.TempDir(), t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("new host"), 0o644); err != nil {
		t.Fatal(err)
	}
	rec := ShareRecord{Name: "v2", Host: "/old/data", Container: "c1", Destination: "/data", Ref: "host directory /old/data at /data"}
	if err := writeShares(snap, []ShareRecord{rec}); err != nil {
		t.Fatal(err)
	}
	s := &Sandbox{o: Options{ID: "sb2", Dir: state}}
	if err := os.Mkdir(s.shareDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	err := s.bindRestoredShares(snap, nil)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "host /old/data at /data") || !strings.Contains(err.Error(), "type=bind") {
		t.Fatalf("restore without the share: %v, want FailedPrecondition naming it and the fix", err)
	}
	bind := rec
	bind.Host, bind.Container = src, "c2"
	if err := s.bindRestoredShares(snap, []ShareRecord{bind}); err != nil {
		t.Fatal(err)
	}
	defer ReleaseShareDir(state)
	if b, err := os.ReadFile(filepath.Join(s.shareDir(), "v2", "f")); err != nil || string(b) != "new host" {
		t.Errorf("share entry v2 after the restore: %q, %v", b, err)
	}
	if len(s.shared) != 1 || s.shared[0].Guest != "/run/cube/shared/v2" || s.shared[0].Host != src || s.shareSeq != 2 {
		t.Errorf("shared %+v, next entry after v%d", s.shared, s.shareSeq)
	}
	if got := s.shareRecords(); len(got) != 1 || got[0].Name != "v2" || got[0].Destination != "/data" {
		t.Errorf("a snapshot of the restored sandbox would record %+v", got)
	}
	if err := ReleaseShareDir(state); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(src, "f")); err != nil || string(b) != "new host" {
		t.Errorf("host file after release: %q, %v", b, err)
	}
	if err := s.UnshareHostDir("/etc/passwd"); err == nil {
		t.Error("unshare of a path outside the share accepted")
	}
}

// ReadShares treats the file as untrusted: entries must be the share's
// own names, paths absolute; no file is no shares.
func TestReadSharesRefusesHostile(t *testing.T) {
	dir := t.TempDir()
	if recs, err := ReadShares(dir); err != nil || recs != nil {
		t.Fatalf("no file: %v, %v", recs, err)
	}
	for name, body := range map[string]string{
		"escape":   `{"shares":[{"name":"../x","host":"/a","destination":"/d"}]}`,
		"not vN":   `{"shares":[{"name":"v01","host":"/a","destination":"/d"}]}`,
		"repeated": `{"shares":[{"name":"v1","host":"/a","destination":"/d"},{"name":"v1","host":"/b","destination":"/e"}]}`,
		"relative": `{"shares":[{"name":"v1","host":"a","destination":"/d"}]}`,
		"garbage":  `{"shares":`,
	} {
		if err := os.WriteFile(filepath.Join(dir, SharesName), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadShares(dir); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("%s: %v, want FailedPrecondition", name, err)
		}
	}
}
