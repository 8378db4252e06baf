package checkpoint

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	cube "github.com/cube-runtime/cube/contrib/sdk/go"
	"github.com/cube-runtime/cube/integration/cubetest"
)

// importForAPI imports the test image into cube-api's namespace.
func (d *daemons) importForAPI(t testing.TB, ctx context.Context) {
	t.Helper()
	imp := exec.CommandContext(ctx, cubetest.CtrBin, "--address", d.Dir+"/containerd.sock", "--namespace", apiNamespace,
		"images", "import", "--snapshotter", "cube", cubetest.ImageTar)
	imp.Env = d.Env
	if out, err := imp.CombinedOutput(); err != nil {
		t.Fatalf("import into %s: %v\n%s", apiNamespace, err, out)
	}
}

// newAPI imports the test image into cube-api's namespace and starts
// cube-api on a free loopback address with sandboxes running the shell
// command line command: its client (the address is c.URL's) and its stop
// function (also run at the test's end).
func (d *daemons) newAPI(t testing.TB, ctx context.Context, command string) (*cube.Client, func()) {
	t.Helper()
	d.importForAPI(t, ctx)
	addr := freeAddr(t)
	stop := d.startAPIWith(t, addr, command)
	return &cube.Client{URL: "http://" + addr, APIKey: apiKey}, stop
}

// apiStartWorker writes the worker into sb and starts it as a background command.
func apiStartWorker(t *testing.T, ctx context.Context, sb *cube.Sandbox) {
	t.Helper()
	bin, err := os.ReadFile(workerBin)
	if err != nil {
		t.Fatalf("the worker binary: %v", err)
	}
	if _, err := sb.Files.Write(ctx, "/worker", bin, cube.WriteOptions{Mode: 0o755}); err != nil {
		t.Fatalf("write the worker: %v", err)
	}
	wk, err := sb.Commands.Start(ctx, "/worker", cube.RunOptions{Args: []string{"serve", workerSock}})
	if err != nil {
		t.Fatal(err)
	}
	wk.Disconnect()
	apiWorkerAbove(t, ctx, sb, 0)
}

// TestCubeAPIRestoreAndFork: through cube-api (Go SDK), a sandbox from the
// image runs the worker (in-memory counter, random identity, pid, digest)
// as a background command; hold → snapshot → release → advance; the
// sandbox is killed; a sandbox created from the snapshot id has the worker
// exactly as at the snapshot (held), and it advances once released. Then
// fork(count=2) of that sandbox, held: both clones answer with its values;
// only the first is released and advances while the second stays held, and
// a file written in one is not in the other (they diverge). The fork's
// temporary snapshot is gone. A template built from the image (readiness:
// the counter of the sandbox's main process is past 20) makes a sandbox
// that maps it (in use, 409 on delete) and whose counter runs on from the
// template's. At the end no sandbox, container or snapshot remains.
func TestCubeAPIRestoreAndFork(t *testing.T) {
	d := startDaemons(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c, _ := d.newAPI(t, ctx, cubetest.CounterScript)
	var made []*cube.Sandbox
	defer func() {
		for _, sb := range made {
			sb.Kill(context.Background())
		}
	}()

	src, err := c.Create(ctx, cube.CreateOptions{Template: cubetest.ImageRef, Timeout: 900})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	made = append(made, src)
	apiStartWorker(t, ctx, src)
	at := apiAsk(t, ctx, src, "hold")
	snap, err := src.CreateSnapshot(ctx, "api-restore")
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	apiAsk(t, ctx, src, "release")
	apiWorkerAbove(t, ctx, src, at.Counter)
	if err := src.Kill(ctx); err != nil {
		t.Fatal(err)
	}

	// Create from the snapshot id: the worker is back as it was at the snapshot.
	start := time.Now()
	rs, err := c.Create(ctx, cube.CreateOptions{Template: snap.SnapshotID, Timeout: 900})
	if err != nil {
		t.Fatalf("create from snapshot %s: %v", snap.SnapshotID, err)
	}
	made = append(made, rs)
	t.Logf("create from snapshot: %s in %v", rs.ID, time.Since(start))
	if rs.ID == src.ID || rs.Info.TemplateID != snap.SnapshotID || rs.Info.State != "running" {
		t.Errorf("restored: %+v", rs.Info)
	}
	if got := apiAsk(t, ctx, rs, "query"); !got.same(at) {
		t.Fatalf("the restored worker is %+v, want the snapshot's %+v", got, at)
	}
	apiAsk(t, ctx, rs, "release")
	apiWorkerAbove(t, ctx, rs, at.Counter)
	if err := c.DeleteSnapshot(ctx, snap.SnapshotID); !cube.IsConflict(err) {
		t.Errorf("delete the snapshot a sandbox runs from: %v, want a conflict", err)
	}
	if _, err := c.Create(ctx, cube.CreateOptions{Template: "0123456789abcdef01234567"}); !cube.IsNotFound(err) {
		t.Errorf("create from an unknown snapshot: %v", err)
	}

	// Fork the restored sandbox, held.
	at2 := apiAsk(t, ctx, rs, "hold")
	start = time.Now()
	items, err := rs.Fork(ctx, 2, cube.ForkOptions{Timeout: 900})
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	t.Logf("fork of 2: %v", time.Since(start))
	var clones []*cube.Sandbox
	for i, it := range items {
		if it.Err != nil {
			t.Errorf("fork item %d: %v", i, it.Err)
			continue
		}
		made = append(made, it.Sandbox)
		clones = append(clones, it.Sandbox)
	}
	if len(clones) != 2 || clones[0].ID == clones[1].ID || clones[0].ID == rs.ID {
		t.Fatalf("fork: %+v", items)
	}
	for _, cl := range clones {
		if got := apiAsk(t, ctx, cl, "query"); !got.same(at2) {
			t.Fatalf("clone %s's worker is %+v, want the source's %+v", cl.ID, got, at2)
		}
	}
	apiAsk(t, ctx, clones[0], "release")
	apiWorkerAbove(t, ctx, clones[0], at2.Counter)
	if got := apiAsk(t, ctx, clones[1], "query"); !got.same(at2) {
		t.Errorf("clone %s changed with its sibling: %+v, want %+v", clones[1].ID, got, at2)
	}
	if _, err := clones[0].Files.Write(ctx, "/tmp/only-in-0", []byte("0")); err != nil {
		t.Fatal(err)
	}
	if ok, err := clones[1].Files.Exists(ctx, "/tmp/only-in-0"); ok || err != nil {
		t.Errorf("a file of clone 0 in clone 1: %v %v", ok, err)
	}
	if got := apiAsk(t, ctx, rs, "query"); !got.same(at2) {
		t.Errorf("the fork's source changed: %+v, want %+v", got, at2)
	}
	if l, _, err := c.ListSnapshots(ctx, cube.ListSnapshotsOptions{}); err != nil || len(l) != 1 || l[0].SnapshotID != snap.SnapshotID {
		t.Errorf("snapshots after the fork (its temporary one must be gone): %+v %v", l, err)
	}

	apiTemplateRound(t, ctx, c)

	for _, sb := range append([]*cube.Sandbox{rs}, clones...) {
		if err := sb.Kill(ctx); err != nil {
			t.Errorf("kill %s: %v", sb.ID, err)
		}
	}
	made = nil
	if err := c.DeleteSnapshot(ctx, snap.SnapshotID); err != nil {
		t.Errorf("delete the snapshot: %v", err)
	}
	ls := exec.CommandContext(ctx, cubetest.CtrBin, "--address", d.Dir+"/containerd.sock", "--namespace", apiNamespace, "containers", "ls", "-q")
	ls.Env = d.Env
	if out, err := ls.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("containers left: %q %v", out, err)
	}
	if l, _, err := c.ListSnapshots(ctx, cube.ListSnapshotsOptions{}); err != nil || len(l) != 0 {
		t.Errorf("snapshots left: %+v %v", l, err)
	}
}

// apiTemplateRound builds a template from the image, creates a sandbox from
// it, checks it runs on from the template's state, and deletes both.
func apiTemplateRound(t *testing.T, ctx context.Context, c *cube.Client) {
	t.Helper()
	before := len(apiSandboxes(t, ctx, c))
	start := time.Now()
	tp, err := c.BuildTemplate(ctx, cubetest.ImageRef, cube.BuildTemplateOptions{TemplateID: "e2e-tpl",
		ReadyCmd: []string{"sh", "-c", `test "$(cat /count 2>/dev/null || echo 0)" -gt 20`}, ReadyTimeout: 240})
	if err != nil {
		t.Fatalf("build a template: %v", err)
	}
	t.Logf("template %s (snapshot %s) built in %v", tp.TemplateID, tp.SnapshotID, time.Since(start))
	if tp.Image != cubetest.ImageRef || tp.InUse {
		t.Errorf("template: %+v", tp)
	}
	if l, err := c.ListTemplates(ctx); err != nil || len(l) != 1 || l[0].TemplateID != "e2e-tpl" {
		t.Errorf("templates: %+v %v", l, err)
	}
	// The build sandbox is gone.
	if after := len(apiSandboxes(t, ctx, c)); after != before {
		t.Errorf("%d sandboxes after the build, %d before", after, before)
	}
	sb, err := c.Create(ctx, cube.CreateOptions{Template: "e2e-tpl", Timeout: 900})
	if err != nil {
		t.Fatalf("create from the template: %v", err)
	}
	defer sb.Kill(context.Background())
	if sb.Info.TemplateID != "e2e-tpl" {
		t.Errorf("from the template: %+v", sb.Info)
	}
	// The counter ran past 20 in the template: the restored one is past it.
	first := apiCounter(t, ctx, sb)
	if first <= 20 {
		t.Errorf("counter %d in a sandbox of the template: want it past the template's 20 (restored, not booted)", first)
	}
	deadline := time.Now().Add(time.Minute)
	for apiCounter(t, ctx, sb) <= first {
		if time.Now().After(deadline) {
			t.Fatalf("the counter of the sandbox from the template stays at %d", first)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got, err := c.GetTemplate(ctx, "e2e-tpl"); err != nil || !got.InUse {
		t.Errorf("template while a sandbox runs from it: %+v %v", got, err)
	}
	if err := c.DeleteTemplate(ctx, "e2e-tpl"); !cube.IsConflict(err) {
		t.Errorf("delete a template in use: %v, want a conflict", err)
	}
	if err := sb.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteTemplate(ctx, "e2e-tpl"); err != nil {
		t.Errorf("delete the template: %v", err)
	}
	if _, err := c.Create(ctx, cube.CreateOptions{Template: "e2e-tpl"}); !cube.IsNotFound(err) {
		t.Errorf("create from a deleted template: %v", err)
	}
}

// apiCounter reads cubetest.CounterScript's /count in sb.
func apiCounter(t *testing.T, ctx context.Context, sb *cube.Sandbox) int {
	t.Helper()
	res, err := sb.Commands.Run(ctx, "cat /count", cube.RunOptions{})
	n, perr := strconv.Atoi(strings.TrimSpace(res.Stdout))
	if err != nil || perr != nil {
		t.Fatalf("%s: read the counter: %+v %v %v", sb.ID, res, err, perr)
	}
	return n
}

func apiSandboxes(t *testing.T, ctx context.Context, c *cube.Client) []cube.SandboxInfo {
	t.Helper()
	l, _, err := c.List(ctx, cube.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}
