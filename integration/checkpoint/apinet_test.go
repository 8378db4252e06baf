package checkpoint

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/checkpoint/sandboxnet"
	cube "github.com/cube-runtime/cube/contrib/sdk/go"
	"github.com/cube-runtime/cube/integration/cubetest"
)

// Two addresses of the test host (on lo), outside the sandboxes' network:
// sandboxes reach them through their default route via the bridge.
const (
	apiNetServerA = "10.96.0.1"
	apiNetServerB = "10.96.0.2"
)

// TestCubeAPINetwork is issue 16's sandbox network through cube-api (items
// 4 and 5): a sandbox made with allow_internet_access false and allowOut
// naming server A of two on the test host reaches A and never B (B's server
// counts no request); PUT …/network, while it runs, flips that; with the
// policy open its HTTP server answers through cube-api's <port>-<id> host
// name. `cube fork` of the sandbox makes clones that each have their own
// address (and MAC) and answer on it, the source keeping its own. Deleting
// sandboxes releases their addresses and bridge ports.
func TestCubeAPINetwork(t *testing.T) {
	d := startDaemons(t)
	for _, ip := range []string{apiNetServerA, apiNetServerB} {
		if out, err := exec.Command("/bin/busybox", "ip", "addr", "add", ip+"/32", "dev", "lo").CombinedOutput(); err != nil {
			t.Fatalf("add %s to lo: %v: %s", ip, err, out)
		}
		t.Cleanup(func() { exec.Command("/bin/busybox", "ip", "addr", "del", ip+"/32", "dev", "lo").Run() })
	}
	a, b := cubetest.NewCountingServer(t, apiNetServerA), cubetest.NewCountingServer(t, apiNetServerB)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c, _ := d.newAPI(t, ctx, cubetest.CounterScript)

	no := false
	sb, err := c.Create(ctx, cube.CreateOptions{Template: cubetest.ImageRef, Timeout: 900, AllowInternetAccess: &no,
		Network: &cube.Network{AllowOut: []string{apiNetServerA}}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	defer sb.Kill(context.Background())
	ip, err := sandboxnet.Address(sandboxnet.Config{Network: apiNetName, ConfDir: filepath.Join(d.Dir, "cni"),
		BinDirs: []string{cubetest.CNIBinDir}, CacheDir: filepath.Join(d.Dir, "cni-cache")}, sb.ID)
	if err != nil {
		t.Fatalf("the sandbox's address: %v", err)
	}
	if res, err := sb.Commands.Run(ctx, "busybox ip -4 addr show eth0", cube.RunOptions{}); err != nil || !strings.Contains(res.Stdout, ip.String()+"/24") {
		t.Errorf("the guest's eth0 lacks %s: %+v %v", ip, res, err)
	}
	fetch := func(sb *cube.Sandbox, s *cubetest.CountingServer) (string, bool) {
		res, _ := sb.Commands.Run(ctx, "busybox timeout 5 busybox wget -q -O - "+s.URL+" 2>&1; echo rc=$?", cube.RunOptions{})
		return res.Stdout, strings.Contains(res.Stdout, "hello-from") && strings.HasSuffix(strings.TrimSpace(res.Stdout), "rc=0")
	}
	if out, ok := fetch(sb, a); !ok {
		t.Errorf("allowOut A: the sandbox did not reach A: %q", out)
	}
	if out, ok := fetch(sb, b); ok || b.Hits.Load() != 0 {
		t.Errorf("B is not allowed: %q, B's server counted %d requests", out, b.Hits.Load())
	}
	// Changed while it runs: B only.
	p, err := sb.SetNetwork(ctx, false, []string{apiNetServerB}, nil)
	if err != nil {
		t.Fatalf("set network: %v", err)
	}
	if len(p.Dropped) == 0 {
		t.Logf("policy after the change: %+v", p)
	}
	hitsA := a.Hits.Load()
	if out, ok := fetch(sb, b); !ok {
		t.Errorf("after allowing B: %q", out)
	}
	if out, ok := fetch(sb, a); ok || a.Hits.Load() != hitsA {
		t.Errorf("A is no longer allowed: %q, A's server counted %d more", out, a.Hits.Load()-hitsA)
	}
	var bad *cube.APIError
	if _, err := sb.SetNetwork(ctx, true, []string{"10.0.0.300"}, nil); err == nil || !asAPIError(err, &bad) || bad.Status != 400 || !strings.Contains(bad.Message, "network.allowOut") {
		t.Errorf("a bad CIDR: %v", err)
	}

	// Open again; the sandbox's HTTP server through cube-api's port host name.
	if _, err := sb.SetNetwork(ctx, true, nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Commands.Run(ctx, "busybox mkdir -p /www && echo hello-through-the-proxy > /www/i", cube.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Commands.Start(ctx, "busybox httpd -f -p 0.0.0.0:8080 -h /www", cube.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	if body, err := proxyGet(strings.TrimPrefix(c.URL, "http://"), sb.GetHost(8080), "/i"); err != nil || strings.TrimSpace(body) != "hello-through-the-proxy" {
		t.Errorf("GET /i at %s: %q %v", sb.GetHost(8080), body, err)
	}

	// Fork: each clone its own address, answering on it; the source keeps its own.
	out, _, rc := d.CubeRun(t, "--namespace", apiNamespace, "fork", sb.ID, "-n", "2", "--prefix", "netclone", "--json")
	var f forked
	if rc != 0 || json.Unmarshal([]byte(out), &f) != nil || len(f.Clones) != 2 {
		t.Fatalf("cube fork -n 2: rc %d\n%s\nshim log:\n%s", rc, out, d.VMMLog(0))
	}
	seen := map[string]string{ip.String(): sb.ID}
	for _, cl := range f.Clones {
		if cl.Error != "" {
			t.Errorf("clone %s: %s", cl.ID, cl.Error)
			continue
		}
		defer d.cubeRemove(t, cl.ID)
		cip, err := sandboxnet.Address(sandboxnet.Config{Network: apiNetName, ConfDir: filepath.Join(d.Dir, "cni"),
			BinDirs: []string{cubetest.CNIBinDir}, CacheDir: filepath.Join(d.Dir, "cni-cache")}, cl.ID)
		if err != nil {
			t.Errorf("clone %s's address: %v", cl.ID, err)
			continue
		}
		if other, dup := seen[cip.String()]; dup {
			t.Errorf("clone %s has %s, as %s", cl.ID, cip, other)
		}
		seen[cip.String()] = cl.ID
		// The clone's httpd (forked with it) answers at the clone's own address.
		if body, err := httpGet("http://" + cip.String() + ":8080/i"); err != nil || strings.TrimSpace(body) != "hello-through-the-proxy" {
			t.Errorf("clone %s at %s: %q %v", cl.ID, cip, body, err)
		}
	}
	if body, err := httpGet("http://" + ip.String() + ":8080/i"); err != nil || strings.TrimSpace(body) != "hello-through-the-proxy" {
		t.Errorf("the source at %s after the fork: %q %v", ip, body, err)
	}
	if res, err := sb.Commands.Run(ctx, "busybox ip -4 addr show eth0", cube.RunOptions{}); err != nil || !strings.Contains(res.Stdout, ip.String()+"/24") {
		t.Errorf("the source's eth0 after the fork: %+v %v", res, err)
	}

	if err := sb.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	for _, cl := range f.Clones {
		d.cubeRemove(t, cl.ID)
	}
	if ports, _ := os.ReadDir("/sys/class/net/" + apiNetBridge + "/brif"); len(ports) != 0 {
		t.Errorf("bridge ports left after every sandbox was deleted: %v", ports)
	}
	leases, _ := filepath.Glob(filepath.Join(d.Dir, "cni-cache", "ipam", apiNetName, "10.97.*"))
	if len(leases) != 0 {
		t.Errorf("address leases left: %v", leases)
	}
}

func asAPIError(err error, target **cube.APIError) bool {
	e, ok := err.(*cube.APIError)
	if ok {
		*target = e
	}
	return ok
}

// proxyGet GETs path from cube-api at addr with Host host, retrying while the
// sandbox's server starts.
func proxyGet(addr, host, path string) (string, error) {
	var last error
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
		req.Host = host
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			last = err
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 {
			return string(b), nil
		}
		last = fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return "", last
}

// httpGet GETs url, retrying for a while.
func httpGet(url string) (string, error) {
	var last error
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
		if err != nil {
			last = err
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 {
			return string(b), nil
		}
		last = fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return "", last
}

// cubeRemove removes container id of cube-api's namespace (a clone of its
// sandbox made by `cube fork`), task first; a missing one is fine.
func (d *daemons) cubeRemove(t *testing.T, id string) {
	ctr := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, cubetest.CtrBin, append([]string{"--address", d.Dir + "/containerd.sock", "--namespace", apiNamespace}, args...)...)
		cmd.Env, cmd.WaitDelay = d.Env, 10*time.Second
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := ctr("task", "rm", "-f", id); err != nil && !strings.Contains(out, "not found") && !strings.Contains(out, "no such") {
		t.Errorf("ctr task rm -f %s: %v\n%s", id, err, out)
	}
	if out, err := ctr("container", "rm", id); err != nil && !strings.Contains(out, "not found") && !strings.Contains(out, "no such") {
		t.Errorf("ctr container rm %s: %v\n%s", id, err, out)
	}
}
