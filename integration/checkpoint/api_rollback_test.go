package checkpoint

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	cube "github.com/cube-runtime/cube/contrib/sdk/go"
)

// apiWorker asks the worker in sandbox sb (a command of its client mode);
// ok is false when it does not answer.
func apiWorker(ctx context.Context, sb *cube.Sandbox, cmd string) (workerState, bool) {
	res, err := sb.Commands.Run(ctx, "/worker", cube.RunOptions{Args: []string{workerSock, cmd}})
	var st workerState
	if err != nil || json.Unmarshal([]byte(strings.TrimSpace(res.Stdout)), &st) != nil {
		return workerState{}, false
	}
	return st, true
}

// apiWorkerAbove waits until the worker answers query with a counter above n.
func apiWorkerAbove(t *testing.T, ctx context.Context, sb *cube.Sandbox, n int64) workerState {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if st, ok := apiWorker(ctx, sb, "query"); ok && st.Counter > n {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("the worker in %s does not answer with a counter above %d", sb.ID, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// apiAsk is apiWorker that must answer.
func apiAsk(t *testing.T, ctx context.Context, sb *cube.Sandbox, cmd string) workerState {
	t.Helper()
	st, ok := apiWorker(ctx, sb, cmd)
	if !ok {
		t.Fatalf("the worker in %s does not answer %q", sb.ID, cmd)
	}
	return st
}

// listed says whether pid is among the sandbox's running commands.
func listed(t *testing.T, ctx context.Context, sb *cube.Sandbox, pid uint32) bool {
	t.Helper()
	l, err := sb.Commands.List(ctx)
	if err != nil {
		t.Fatalf("list commands: %v", err)
	}
	for _, c := range l {
		if c.Pid == pid {
			return true
		}
	}
	return false
}

// waitListed waits until pid is (want) or is not listed.
func waitListed(t *testing.T, ctx context.Context, sb *cube.Sandbox, pid uint32, want bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for listed(t, ctx, sb, pid) != want {
		if time.Now().After(deadline) {
			t.Fatalf("command %d listed: want %v", pid, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// apiRollbackRound is the rollback round through the Go SDK: the worker
// (in-memory counter, random identity, pid, digest) started as a
// background command; hold → snapshot → release → it advances → SIGKILL →
// rollback → every field equals the snapshot's and the worker is listed
// again → release → it advances → killed through the API. It returns the
// snapshot's id (the sandbox holds it until it ends).
func apiRollbackRound(t *testing.T, ctx context.Context, sb *cube.Sandbox) string {
	t.Helper()
	bin, err := os.ReadFile(workerBin)
	if err != nil {
		t.Fatalf("the worker binary: %v", err)
	}
	// A binary of several MiB through the files route: more than one chunk to the guest agent.
	if ei, err := sb.Files.Write(ctx, "/worker", bin, cube.WriteOptions{Mode: 0o755}); err != nil || ei.Size != int64(len(bin)) || ei.Permissions != "-rwxr-xr-x" {
		t.Fatalf("write the worker: %+v %v", ei, err)
	}
	wk, err := sb.Commands.Start(ctx, "/worker", cube.RunOptions{Args: []string{"serve", workerSock}})
	if err != nil {
		t.Fatal(err)
	}
	wk.Disconnect() // a background command: it runs on
	apiWorkerAbove(t, ctx, sb, 0)

	at := apiAsk(t, ctx, sb, "hold")
	snap, err := sb.CreateSnapshot(ctx, "api-rb")
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if st := apiAsk(t, ctx, sb, "query"); !st.same(at) {
		t.Fatalf("the held worker changed across the snapshot: %+v, then %+v", at, st)
	}
	apiAsk(t, ctx, sb, "release")
	apiWorkerAbove(t, ctx, sb, at.Counter)

	if err := sb.Commands.Kill(ctx, wk.Pid, nil); err != nil {
		t.Fatalf("SIGKILL the worker: %v", err)
	}
	waitListed(t, ctx, sb, wk.Pid, false)
	if st, ok := apiWorker(ctx, sb, "query"); ok {
		t.Fatalf("the killed worker still answers: %+v", st)
	}

	start := time.Now()
	rb, err := sb.Rollback(ctx, "api-rb")
	if err != nil {
		t.Fatalf("rollback: %v", err)
	}
	t.Logf("rollback to %s: %v (frozen %.1f ms, total %.1f ms, memory %s, processes %+v, warnings %q)",
		rb.SnapshotID, time.Since(start), rb.FrozenMs, rb.TotalMs, rb.Memory, rb.Processes, rb.Warnings)
	if rb.SandboxID != sb.ID || rb.SnapshotID != snap.SnapshotID {
		t.Errorf("rollback: %+v", rb)
	}
	if got := apiAsk(t, ctx, sb, "query"); !got.same(at) {
		t.Fatalf("after the rollback the worker is %+v, want the snapshot's %+v", got, at)
	}
	// The worker came back: listed, with its command line.
	l, err := sb.Commands.List(ctx)
	found := false
	for _, c := range l {
		if c.Pid == wk.Pid && c.Cmd == "/worker" {
			found = true
		}
	}
	if err != nil || !found {
		t.Errorf("after the rollback the worker (pid %d) is not listed: %+v %v", wk.Pid, l, err)
	}
	apiAsk(t, ctx, sb, "release")
	apiWorkerAbove(t, ctx, sb, at.Counter)
	// A command that came back is killed through the API too.
	if err := sb.Commands.Kill(ctx, wk.Pid, nil); err != nil {
		t.Fatalf("kill the worker after the rollback: %v", err)
	}
	waitListed(t, ctx, sb, wk.Pid, false)
	if _, err := sb.Rollback(ctx, "no-such-snapshot"); !cube.IsNotFound(err) {
		t.Errorf("rollback to an unknown snapshot: %v", err)
	}
	return snap.SnapshotID
}

// apiFilesRound: write, read back, stat, list, make a directory, remove,
// in the sandbox's root through the Go SDK.
func apiFilesRound(t *testing.T, ctx context.Context, sb *cube.Sandbox) {
	t.Helper()
	data := []byte("line one\nbytes \x00\xff\n")
	ei, err := sb.Files.Write(ctx, "/tmp/api files/a.txt", data)
	if err != nil || ei.Size != int64(len(data)) || ei.Type != "file" || ei.Path != "/tmp/api files/a.txt" {
		t.Fatalf("write: %+v %v", ei, err)
	}
	if got, err := sb.Files.Read(ctx, "/tmp/api files/a.txt"); err != nil || string(got) != string(data) {
		t.Errorf("read: %q %v", got, err)
	}
	// What the files route wrote, a command sees.
	if res, err := sb.Commands.Run(ctx, "head -n 1 '/tmp/api files/a.txt'", cube.RunOptions{}); err != nil || res.Stdout != "line one\n" {
		t.Errorf("the file in the sandbox: %+v %v", res, err)
	}
	if _, err := sb.Commands.Run(ctx, "mkdir -p /tmp/from-cmd && echo hi > /tmp/from-cmd/x && ln -s x /tmp/from-cmd/l", cube.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := sb.Files.Read(ctx, "/tmp/from-cmd/x"); err != nil || string(got) != "hi\n" {
		t.Errorf("read what a command wrote: %q %v", got, err)
	}
	if ok, err := sb.Files.MakeDir(ctx, "/tmp/api files/sub/deeper"); !ok || err != nil {
		t.Errorf("make dir: %v %v", ok, err)
	}
	l, err := sb.Files.List(ctx, "/tmp/api files")
	if err != nil || len(l) != 2 || l[0].Name != "a.txt" || l[1].Name != "sub" || l[1].Type != "dir" {
		t.Errorf("list: %+v %v", l, err)
	}
	if fi, err := sb.Files.GetInfo(ctx, "/tmp/from-cmd/l"); err != nil || fi.Type != "symlink" || fi.SymlinkTarget != "x" {
		t.Errorf("stat a symlink: %+v %v", fi, err)
	}
	if err := sb.Files.Remove(ctx, "/tmp/api files"); !cube.IsConflict(err) {
		t.Errorf("remove a full directory: %v", err)
	}
	if err := sb.Files.Remove(ctx, "/tmp/api files", true); err != nil {
		t.Fatal(err)
	}
	if ok, err := sb.Files.Exists(ctx, "/tmp/api files"); ok || err != nil {
		t.Errorf("after remove: %v %v", ok, err)
	}
	if _, err := sb.Files.Read(ctx, "/no/such/file"); !cube.IsNotFound(err) {
		t.Errorf("read a missing file: %v", err)
	}
}
