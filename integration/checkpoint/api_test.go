package checkpoint

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	cube "github.com/cube-runtime/cube/contrib/sdk/go"
	"github.com/cube-runtime/cube/integration/cubetest"
)

// apiBin is cube-api in the test host (TestMain builds it).
const apiBin = "/cube/bin/cube-api"

// apiNamespace is cube-api's own containerd namespace in TestCubeAPI.
const apiNamespace = "cube-api-e2e"

const apiKey = "e2e-api-key-0123456789"

// apiConfig is cube-api's config for d's containerd and store.
const apiConfig = `listen = %q
api_keys = [%q]
containerd_address = %q
containerd_state = %q
namespace = %q
store_root = %q
sandbox_command = ["sh", "-c", %q]
default_sandbox_timeout = 600
log_level = "debug"

[network]
name = %q
cni_conf_dir = %q
cni_cache_dir = %q
cni_bin_dirs = [%q]
hook = %q
`

// The sandboxes' network in the test host: cube-api's default list's bridge
// without its NAT and portmap (the test host has no outside to NAT to, and
// cube-api's sandboxes publish ports through its host-name proxy). The root
// tier runs the default list as written on the machine
// (checkpoint/sandboxnet TestDefaultNetworkRoot); portmap in the test host is
// e2e through the ctr hook path (integration/shim TestCtrHookNetwork).
const (
	apiNetName    = "cube-e2e"
	apiNetBridge  = "cubee2e0"
	apiNetGateway = "10.97.0.1"
	apiNetConf    = `{"cniVersion": "1.0.0", "name": "` + apiNetName + `", "plugins": [{"type": "bridge", "bridge": "` + apiNetBridge + `",
  "isGateway": true, "ipMasq": false, "hairpinMode": true,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.97.0.0/24", "gateway": "` + apiNetGateway + `"}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "%s"}}]}`
)

// startAPI starts cube-api on a free loopback port and waits for /health;
// the returned function stops it (SIGTERM, graceful). Its sandboxes run
// cubetest.CounterScript.
func (d *daemons) startAPI(t testing.TB, addr string) func() {
	t.Helper()
	return d.startAPIWith(t, addr, cubetest.CounterScript)
}

// startAPIWith is startAPI with sandboxes running the shell command line
// command.
func (d *daemons) startAPIWith(t testing.TB, addr, command string) func() {
	t.Helper()
	stop, err := d.startAPIErr(t, addr, command)
	if err != nil {
		t.Fatal(err)
	}
	return stop
}

// startAPIErr is startAPIWith returning its failure instead of failing the test (for goroutines other than the
// test's: serveDemo's restart route).
func (d *daemons) startAPIErr(t testing.TB, addr, command string) (func(), error) {
	if _, err := os.Stat(apiBin); err != nil {
		return nil, fmt.Errorf("cube-api not in the test host: %w", err)
	}
	conf := filepath.Join(d.Dir, "api.toml")
	cniConf, cniCache := filepath.Join(d.Dir, "cni"), filepath.Join(d.Dir, "cni-cache")
	os.MkdirAll(cniConf, 0o755)
	os.WriteFile(filepath.Join(cniConf, apiNetName+".conflist"), fmt.Appendf(nil, apiNetConf, filepath.Join(cniCache, "ipam")), 0o644)
	os.WriteFile(conf, fmt.Appendf(nil, apiConfig, addr, apiKey, d.Dir+"/containerd.sock", d.Dir+"/state",
		apiNamespace, d.StoreRoot(), command, apiNetName, cniConf, cniCache, cubetest.CNIBinDir, cubetest.CubeBin), 0o644)
	logPath := filepath.Join(d.Dir, "api.log")
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	defer lf.Close()
	cmd := exec.Command(apiBin, "--config", conf)
	cmd.Env, cmd.Stdout, cmd.Stderr = d.Env, lf, lf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start cube-api: %w", err)
	}
	var once sync.Once
	stopAPI := func() { once.Do(func() { cubetest.Stop(t, cmd, logPath) }) }
	t.Cleanup(stopAPI)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return stopAPI, nil
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logPath)
			stopAPI()
			return nil, fmt.Errorf("cube-api did not answer on %s in 30s: %v\n%s", addr, err, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// freeAddr is a loopback address with a free port.
func freeAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestCubeAPI drives cube-api against the real containerd, shim and VMM over
// HTTP (through the Go SDK): create → commands → snapshot → list → pause →
// connect → restart of cube-api → delete, and the error answers.
func TestCubeAPI(t *testing.T) {
	d := startDaemons(t)
	// cube-api keeps its sandboxes in a namespace of its own: the image goes there too.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c, stopAPI := d.newAPI(t, ctx, cubetest.CounterScript)
	addr := strings.TrimPrefix(c.URL, "http://")

	// Errors: no key, unknown template.
	if _, _, err := (&cube.Client{URL: c.URL}).List(ctx, cube.ListOptions{}); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("without a key: %v", err)
	}
	if _, err := c.Create(ctx, cube.CreateOptions{Template: "docker.io/nope/nope:1"}); !cube.IsNotFound(err) {
		t.Errorf("unknown template: %v", err)
	}

	start := time.Now()
	sb, err := c.Create(ctx, cube.CreateOptions{Template: cubetest.ImageRef, Timeout: 900, Metadata: map[string]string{"test": "e2e"},
		Envs: map[string]string{"GREETING": "hello"}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Logf("create: %s in %v", sb.ID, time.Since(start))
	defer sb.Kill(context.Background())
	if sb.Info.State != "running" {
		t.Errorf("created: %+v", sb.Info)
	}

	res, err := sb.Commands.Run(ctx, "echo $GREETING; echo oops >&2; exit 3", cube.RunOptions{})
	if r, ok := cube.IsExitError(err); !ok || r.ExitCode != 3 || r.Stdout != "hello\n" || r.Stderr != "oops\n" {
		t.Errorf("run: %+v %v", res, err)
	}
	if res, err = sb.Commands.Run(ctx, "pwd", cube.RunOptions{Cwd: "/tmp"}); err != nil || res.Stdout != "/tmp\n" {
		t.Errorf("cwd: %+v %v", res, err)
	}
	cat, err := sb.Commands.Start(ctx, "/bin/cat", cube.RunOptions{Args: []string{}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := sb.Commands.List(ctx); err != nil || len(l) != 1 || l[0].Pid != cat.Pid {
		t.Errorf("list: %+v %v", l, err)
	}
	if err := cat.SendStdin(ctx, "from stdin\n"); err != nil {
		t.Fatal(err)
	}
	if err := cat.CloseStdin(ctx); err != nil {
		t.Fatal(err)
	}
	if r, err := cat.Wait(); err != nil || r.Stdout != "from stdin\n" {
		t.Errorf("cat: %+v %v", r, err)
	}

	start = time.Now()
	snap, err := sb.CreateSnapshot(ctx, "api-s1")
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	t.Logf("snapshot %s: %v (frozen %.1f ms, total %.1f ms)", snap.SnapshotID, time.Since(start), snap.FrozenMs, snap.TotalMs)
	if snap.SandboxID != sb.ID || snap.Kind != "full" || snap.SizeBytes <= 0 {
		t.Errorf("snapshot: %+v", snap)
	}
	if l, _, err := sb.ListSnapshots(ctx, 10, ""); err != nil || len(l) != 1 || l[0].SnapshotID != snap.SnapshotID {
		t.Errorf("snapshots of the sandbox: %+v %v", l, err)
	}
	if res, err = sb.Commands.Run(ctx, "echo after", cube.RunOptions{}); err != nil || res.Stdout != "after\n" {
		t.Errorf("after the snapshot: %+v %v", res, err)
	}
	apiFilesRound(t, ctx, sb)
	apiRollbackRound(t, ctx, sb)
	if res, err = sb.Commands.Run(ctx, "echo after-rollback", cube.RunOptions{}); err != nil || res.Stdout != "after-rollback\n" {
		t.Errorf("after the rollback: %+v %v", res, err)
	}

	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if l, _, err := c.List(ctx, cube.ListOptions{State: []string{"paused"}}); err != nil || len(l) != 1 || l[0].SandboxID != sb.ID {
		t.Errorf("paused: %+v %v", l, err)
	}
	if _, err := c.Connect(ctx, sb.ID, 0); err != nil {
		t.Fatal(err)
	}

	// A restart of cube-api loses nothing: the sandbox is listed with its metadata and runs commands.
	stopAPI()
	d.startAPI(t, addr)
	l, _, err := c.List(ctx, cube.ListOptions{Metadata: map[string]string{"test": "e2e"}})
	if err != nil || len(l) != 1 || l[0].SandboxID != sb.ID || l[0].State != "running" || l[0].Timeout != 900 {
		t.Fatalf("after the restart: %+v %v", l, err)
	}
	if res, err = sb.Commands.Run(ctx, "echo again", cube.RunOptions{}); err != nil || res.Stdout != "again\n" {
		t.Errorf("after the restart: %+v %v", res, err)
	}

	if err := sb.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Connect(ctx, sb.ID, 0); !cube.IsNotFound(err) {
		t.Errorf("killed sandbox: %v", err)
	}
	ls := exec.CommandContext(ctx, cubetest.CtrBin, "--address", d.Dir+"/containerd.sock", "--namespace", apiNamespace, "containers", "ls", "-q")
	ls.Env = d.Env
	if out, err := ls.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("containers left: %q %v", out, err)
	}
	// The snapshot outlived its sandbox; then it goes too.
	if _, err := c.GetSnapshot(ctx, "api-s1"); err != nil {
		t.Errorf("snapshot after the sandbox: %v", err)
	}
	for _, name := range []string{"api-s1", "api-rb"} {
		if err := c.DeleteSnapshot(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if l, _, err := c.ListSnapshots(ctx, cube.ListSnapshotsOptions{}); err != nil || len(l) != 0 {
		t.Errorf("snapshots left: %+v %v", l, err)
	}
}
