package volume

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/sandbox/sandboxtest"
	"github.com/cube-runtime/cube/shim/volume/volumetest"
)

func newTestSyncer(t *testing.T, a *sandboxtest.Agent) *Syncer {
	log := logrus.New()
	log.SetOutput(os.Stderr)
	log.SetLevel(logrus.WarnLevel)
	s := NewSyncer(SyncerOptions{Agent: func() Agent { return a }, Interval: 10 * time.Millisecond, Log: log})
	t.Cleanup(s.Close)
	return s
}

// guestKey returns the content the guest's copy of dir shows for key
// (through "..data", as a reader in the container would).
func guestKey(a *sandboxtest.Agent, dir, key string) string {
	tr, ok := a.Tree(dir)
	if !ok {
		return ""
	}
	target := map[string]string{}
	data := map[string]string{}
	for _, e := range tr.Entries {
		switch e.Kind {
		case sandbox.TreeSymlink:
			target[e.Path] = e.Target
		case sandbox.TreeFile:
			data[e.Path] = string(e.Data)
		}
	}
	if target[key] != "..data/"+key {
		return ""
	}
	return data[target["..data"]+"/"+key]
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSyncerTreeFollowsTheHost(t *testing.T) {
	a := sandboxtest.NewAgent()
	host := t.TempDir()
	s := newTestSyncer(t, a)
	guest := "/run/cube/volumes/configmap/cfg"
	if err := volumetest.WriteAtomic(host, map[string]string{"k": "v1"}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddTree(context.Background(), host, guest); err != nil {
		t.Fatal(err)
	}
	// Copied before AddTree returns: the container can start on it.
	if got := guestKey(a, guest, "k"); got != "v1" {
		t.Fatalf("after AddTree the guest has %q", got)
	}
	if err := volumetest.WriteAtomic(host, map[string]string{"k": "v2", "new": "n"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the swap to reach the guest", func() bool { return guestKey(a, guest, "k") == "v2" && guestKey(a, guest, "new") == "n" })
	// Unchanged host: no more pushes.
	n := a.CallCount("SyncTree")
	time.Sleep(100 * time.Millisecond)
	if m := a.CallCount("SyncTree"); m != n {
		t.Fatalf("%d pushes of an unchanged tree", m-n)
	}
	// Resync (after a rollback) pushes again though nothing changed.
	s.Resync()
	waitFor(t, "the resync", func() bool { return a.CallCount("SyncTree") > n })
}

func TestSyncerRefcountAndRelease(t *testing.T) {
	a := sandboxtest.NewAgent()
	host := t.TempDir()
	s := newTestSyncer(t, a)
	guest := "/run/cube/volumes/secret/s"
	if err := volumetest.WriteAtomic(host, map[string]string{"k": "1"}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // two containers of the pod mount it
		if err := s.AddTree(context.Background(), host, guest); err != nil {
			t.Fatal(err)
		}
	}
	if n := a.CallCount("SyncTree"); n != 1 {
		t.Fatalf("two AddTree of one volume pushed %d times", n)
	}
	s.Release(guest)
	if len(s.Items()) != 1 {
		t.Fatal("released while a container still mounts it")
	}
	s.Release(guest)
	if len(s.Items()) != 0 {
		t.Fatal("still synced after the last release")
	}
	n := a.CallCount("SyncTree")
	if err := volumetest.WriteAtomic(host, map[string]string{"k": "2"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if a.CallCount("SyncTree") != n {
		t.Fatal("a released volume was pushed")
	}
}

// A push that fails (agent error, or a host tree that became invalid)
// leaves the guest's last copy and is retried until it succeeds.
func TestSyncerRetriesFailures(t *testing.T) {
	a := sandboxtest.NewAgent()
	host := t.TempDir()
	s := newTestSyncer(t, a)
	guest := "/run/cube/volumes/projected/token"
	if err := volumetest.WriteAtomic(host, map[string]string{"token": "t1"}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddTree(context.Background(), host, guest); err != nil {
		t.Fatal(err)
	}
	a.SetTreeErr(errors.New("agent busy"))
	if err := volumetest.WriteAtomic(host, map[string]string{"token": "t2"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "failed pushes", func() bool { return a.CallCount("SyncTree") >= 3 })
	if got := guestKey(a, guest, "token"); got != "t1" {
		t.Fatalf("guest has %q after failed pushes, want the last good t1", got)
	}
	a.SetTreeErr(nil)
	waitFor(t, "the retry", func() bool { return guestKey(a, guest, "token") == "t2" })
	// An escaping link on the host: refused, the guest keeps t2.
	if err := os.Symlink("/etc/shadow", filepath.Join(host, "..evil")); err != nil {
		t.Fatal(err)
	}
	if err := volumetest.WriteAtomic(host, map[string]string{"token": "t3"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if got := guestKey(a, guest, "token"); got != "t2" {
		t.Fatalf("guest has %q, want t2 kept while the host tree is invalid", got)
	}
}

func TestSyncerFile(t *testing.T) {
	a := sandboxtest.NewAgent()
	s := newTestSyncer(t, a)
	host := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(host, []byte("127.0.0.1 localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	guest := "/run/cube/files/c1/0-hosts"
	if err := s.AddFile(context.Background(), host, guest); err != nil {
		t.Fatal(err)
	}
	if d, mode, ok := a.File(guest); !ok || string(d) != "127.0.0.1 localhost\n" || mode != 0o644 {
		t.Fatalf("guest file %q %o %v", d, mode, ok)
	}
	if err := os.WriteFile(host, []byte("10.0.0.1 svc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the edit to reach the guest", func() bool { d, _, _ := a.File(guest); return string(d) == "10.0.0.1 svc\n" })
	big := filepath.Join(t.TempDir(), "big")
	if err := os.Truncate(mustCreate(filepath.Dir(big), "big"), MaxFile+1); err != nil {
		t.Fatal(err)
	}
	if err := s.AddFile(context.Background(), big, "/run/cube/files/c1/1-big"); err == nil || !strings.Contains(err.Error(), "more than the "+fmt.Sprint(MaxFile)) {
		t.Fatalf("AddFile of a big file: %v", err)
	}
}
