package api

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// The fake backend is a Networker: policies are recorded, every sandbox is
// at 127.0.0.1 (the proxy tests serve its "ports" there).
var _ Networker = (*fakeBackend)(nil)

func (f *fakeBackend) SetNetworkPolicy(ctx context.Context, id string, p NetworkPolicy) (NetworkPolicy, error) {
	if _, err := f.Get(ctx, id); err != nil {
		return NetworkPolicy{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.policies == nil {
		f.policies = map[string]NetworkPolicy{}
	}
	f.policies[id] = p
	return p, nil
}

func (f *fakeBackend) Address(ctx context.Context, id string) (net.IP, error) {
	if _, err := f.Get(ctx, id); err != nil {
		return nil, err
	}
	return net.IPv4(127, 0, 0, 1), nil
}

func TestCreateNetwork(t *testing.T) {
	e := newEnv(t, nil)
	// Default: a network, everything allowed, public ports.
	sb := e.create(nil)
	spec := e.f.specs[sb.SandboxID]
	if spec.Network == nil || !spec.Network.AllowInternetAccess || len(spec.Network.AllowOut)+len(spec.Network.DenyOut) != 0 {
		t.Errorf("default network: %+v", spec.Network)
	}
	if _, ok := spec.Labels[LabelPublic]; ok {
		t.Errorf("public-traffic label without the field: %v", spec.Labels)
	}
	sb = e.create(map[string]any{"allow_internet_access": false,
		"network": map[string]any{"allowOut": []string{"10.0.0.0/8", "192.168.1.7"}, "denyOut": []string{"10.9.0.0/16"}, "allowPublicTraffic": false}})
	spec = e.f.specs[sb.SandboxID]
	p := spec.Network
	if p == nil || p.AllowInternetAccess || strings.Join(p.AllowOut, ",") != "10.0.0.0/8,192.168.1.7" || strings.Join(p.DenyOut, ",") != "10.9.0.0/16" {
		t.Errorf("policy: %+v", p)
	}
	if spec.Labels[LabelPublic] != "false" {
		t.Errorf("labels: %v", spec.Labels)
	}
	a := p.annotations()
	if a[annotationAllowInternet] != "false" || a[annotationAllowOut] != "10.0.0.0/8,192.168.1.7" || a[annotationDenyOut] != "10.9.0.0/16" {
		t.Errorf("annotations: %v", a)
	}
	e.wantError("POST", "/sandboxes", map[string]any{"templateID": "docker.io/library/busybox:latest",
		"network": map[string]any{"allowOut": []string{"10.0.0.0/33"}}}, 400, "network.allowOut", "10.0.0.0/33")
	e.wantError("POST", "/sandboxes", map[string]any{"templateID": "docker.io/library/busybox:latest",
		"network": map[string]any{"denyOut": []string{"example.com"}}}, 400, "network.denyOut")
	e.wantError("POST", "/sandboxes", map[string]any{"templateID": "docker.io/library/busybox:latest",
		"network": map[string]any{"allowOut": "10.0.0.0/8"}}, 400, "allowOut")
	many := make([]string, maxCIDRs+1)
	for i := range many {
		many[i] = fmt.Sprintf("10.%d.%d.0/24", i/256, i%256)
	}
	e.wantError("POST", "/sandboxes", map[string]any{"templateID": "docker.io/library/busybox:latest",
		"network": map[string]any{"allowOut": many}}, 400, "more than 256")
}

func TestCreateWithoutNetwork(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Network.Mode = NetworkNone })
	sb := e.create(nil)
	if n := e.f.specs[sb.SandboxID].Network; n != nil {
		t.Errorf("network.mode none: %+v", n)
	}
	e.wantError("POST", "/sandboxes", map[string]any{"templateID": "docker.io/library/busybox:latest", "allow_internet_access": false},
		400, "network.mode")
	e.wantError("PUT", "/sandboxes/"+sb.SandboxID+"/network", map[string]any{"allowOut": []string{"10.0.0.1"}}, 409, "network.mode")
}

func TestSetNetworkPolicy(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.create(nil)
	var got NetworkPolicy
	e.want("PUT", "/sandboxes/"+sb.SandboxID+"/network", map[string]any{"allow_internet_access": false, "allowOut": []string{"1.2.3.4"}}, 200, &got)
	if got.AllowInternetAccess || strings.Join(got.AllowOut, ",") != "1.2.3.4" {
		t.Errorf("answer: %+v", got)
	}
	if p := e.f.policies[sb.SandboxID]; p.AllowInternetAccess || strings.Join(p.AllowOut, ",") != "1.2.3.4" {
		t.Errorf("backend got %+v", p)
	}
	// An empty object resets to open.
	e.want("PUT", "/sandboxes/"+sb.SandboxID+"/network", map[string]any{}, 200, &got)
	if p := e.f.policies[sb.SandboxID]; !p.AllowInternetAccess || len(p.AllowOut) != 0 {
		t.Errorf("reset: %+v", p)
	}
	e.wantError("PUT", "/sandboxes/nope/network", map[string]any{}, 404)
	e.wantError("PUT", "/sandboxes/"+sb.SandboxID+"/network", map[string]any{"denyOut": []string{"x"}}, 400, "network.denyOut")
	e.wantError("PUT", "/sandboxes/"+sb.SandboxID+"/network", map[string]any{"allowPublicTraffic": true}, 400, "allowPublicTraffic")
	e.wantError("PUT", "/sandboxes/"+sb.SandboxID+"/network", nil, 400, "empty")
}

func TestProxyTarget(t *testing.T) {
	for host, want := range map[string]string{
		"8080-abc123.cube.local":                 "abc123 8080",
		"3000-ABC.localhost:3000":                "abc 3000",
		"80-x.e2b.app":                           "x 80",
		"127.0.0.1:3000":                         "",
		"localhost":                              "",
		"70000-abc.d":                            "",
		"0-abc.d":                                "",
		"8080-abc":                               "",
		"8080-ab_c.d":                            "",
		"8080-" + strings.Repeat("a", 65) + ".d": "",
	} {
		id, port, ok := proxyTarget(host)
		got := ""
		if ok {
			got = fmt.Sprintf("%s %d", id, port)
		}
		if got != want {
			t.Errorf("%q: %q, want %q", host, got, want)
		}
	}
}

func TestProxy(t *testing.T) {
	e := newEnv(t, nil, testKey)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "app %s %s host=%s", r.Method, r.URL.Path, r.Host)
	}))
	defer app.Close()
	u, _ := url.Parse(app.URL)
	_, port, _ := net.SplitHostPort(u.Host)
	pub := e.create(nil)
	priv := e.create(map[string]any{"network": map[string]any{"allowPublicTraffic": false}})
	get := func(host string, key bool) (int, string) {
		req, _ := http.NewRequest("GET", e.srv.URL+"/some/path", nil)
		req.Host = host
		if key {
			req.Header.Set("X-API-Key", testKey)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	host := port + "-" + pub.SandboxID + ".cube.test"
	if code, body := get(host, false); code != 200 || body != "app GET /some/path host="+host {
		t.Errorf("public sandbox's port: %d %q", code, body)
	}
	host = port + "-" + priv.SandboxID + ".cube.test"
	if code, body := get(host, false); code != 401 || !strings.Contains(body, "allowPublicTraffic") {
		t.Errorf("private sandbox without a key: %d %q", code, body)
	}
	if code, body := get(host, true); code != 200 || !strings.HasPrefix(body, "app GET") {
		t.Errorf("private sandbox with a key: %d %q", code, body)
	}
	if code, _ := get(port+"-nosuchsandbox.cube.test", false); code != 404 {
		t.Errorf("unknown sandbox: %d", code)
	}
	// Nothing listens on the port: 503 naming it.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	_, closed, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	if code, body := get(closed+"-"+pub.SandboxID+".cube.test", false); code != 503 || !strings.Contains(body, "port "+closed) {
		t.Errorf("closed port: %d %q", code, body)
	}
	// The API itself is not taken for a port host.
	if code, _ := get("127.0.0.1", true); code != 404 {
		t.Errorf("plain host: %d", code)
	}
	if !strings.Contains(e.logs.String(), "{port}-{sandboxID}.{domain}") {
		t.Errorf("proxied requests are not logged with their route")
	}
}

func TestNetworkConfig(t *testing.T) {
	c := DefaultConfig()
	if c.Network.Mode != NetworkCube || c.Network.Name != "cube" || c.Network.CNIConfDir != "/etc/cube/cni" {
		t.Errorf("defaults: %+v", c.Network)
	}
	for in, want := range map[string]string{
		"[network]\nmode = \"bridge\"":    "network.mode",
		"[network]\nname = \"\"":          "network.name",
		"[network]\ncni_bin_dirs = []":    "cni_bin_dirs",
		"[network]\ncni_cache_dir = \"\"": "cni_cache_dir",
		"[network]\nmodee = \"none\"":     "modee",
	} {
		if _, err := ParseConfig([]byte(in)); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", in, err)
		}
	}
	if c, err := ParseConfig([]byte("[network]\nmode = \"none\"\nname = \"\"")); err != nil || c.Network.Mode != NetworkNone {
		t.Errorf("mode none ignores the rest: %+v %v", c.Network, err)
	}
	// PrepareNetwork: the default list written, plugins and the hook found.
	dir := t.TempDir()
	n := NetworkConfig{Mode: NetworkCube, Name: "cube", CNIConfDir: filepath.Join(dir, "conf"), CNIBinDirs: []string{filepath.Join(dir, "bin")},
		CNICacheDir: filepath.Join(dir, "cache"), Hook: filepath.Join(dir, "cube")}
	if _, err := PrepareNetwork(n); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "mode = \"none\"") {
		t.Errorf("no plugins: %v", err)
	}
	os.MkdirAll(n.CNIBinDirs[0], 0o755)
	for _, p := range []string{"bridge", "portmap"} {
		os.WriteFile(filepath.Join(n.CNIBinDirs[0], p), []byte("#!/bin/sh\n"), 0o755)
	}
	if _, err := PrepareNetwork(n); err == nil || !strings.Contains(err.Error(), "network.hook") {
		t.Errorf("missing hook: %v", err)
	}
	os.WriteFile(n.Hook, []byte("#!/bin/sh\n"), 0o755)
	sn, err := PrepareNetwork(n)
	if err != nil || sn.Hook != n.Hook || sn.CNI.ConfDir != n.CNIConfDir {
		t.Errorf("prepared: %+v %v", sn, err)
	}
	n.Hook = "relative/cube"
	if _, err := PrepareNetwork(n); !errdefs.IsInvalidArgument(err) {
		t.Errorf("relative hook: %v", err)
	}
	if sn, err := PrepareNetwork(NetworkConfig{Mode: NetworkNone}); sn != nil || err != nil {
		t.Errorf("mode none: %v %v", sn, err)
	}
}
