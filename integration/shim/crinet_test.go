package shim

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/cubetest"
)

// The pod network: a bridge in the test host with the gateway address, so
// the test (in the test host's namespace) reaches pod IPs directly. No NAT
// (ipMasq): nothing leaves the test host.
const (
	criCNIBridge  = "cube-cni0"
	criCNIGateway = "10.88.0.1"
	criCNIConf    = `{"cniVersion": "1.0.0", "name": "cube-e2e", "plugins": [{
  "type": "bridge", "bridge": "` + criCNIBridge + `", "isGateway": true, "ipMasq": false,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/16", "gateway": "` + criCNIGateway + `"}]],
           "routes": [{"dst": "0.0.0.0/0"}]}}]}`
)

// criPodNetwork writes the CNI config; the plugins must be in the test host
// (a missing one fails the test: CI installs them). It reports true: the
// pod gets a CNI network.
func criPodNetwork(t *testing.T, c *criEnv) bool {
	for _, p := range cubetest.CNIPlugins {
		if _, err := os.Stat(filepath.Join(cubetest.CNIBinDir, p)); err != nil {
			t.Fatalf("CNI plugin %s not in the test host: the machine lacks Debian's containernetworking-plugins (install it: bash .ci/install.d/containerd.sh, or apt install containernetworking-plugins)", p)
		}
	}
	dir := filepath.Join(c.dir, "net.d")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "10-cube-e2e.conflist"), []byte(criCNIConf), 0o644); err != nil {
		t.Fatal(err)
	}
	return true
}

// withPodNetwork turns a pod or container config's host network (2, NODE) into the pod's own (0, POD).
func withPodNetwork(config string) string {
	return strings.ReplaceAll(config, `"network": 2`, `"network": 0`)
}

// podIP is the pod's address as CRI reports it (from CNI's result).
func podIP(t *testing.T, c *criEnv, pod string) string {
	out, err := c.crictl("inspectp", "-o", "json", pod)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Status struct {
			Network struct {
				IP string `json:"ip"`
			} `json:"network"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || net.ParseIP(st.Status.Network.IP) == nil {
		t.Fatalf("crictl inspectp: no pod IP (%v) in:\n%s", err, out)
	}
	return st.Status.Network.IP
}

// checkPodNetwork: the guest's eth0 (as containers a and b see it: they
// share the guest's initial network namespace) has the pod IP CNI gave the
// veth; a server in a answers the test host at that IP; b reaches a server
// on the test host at the bridge's gateway address.
func checkPodNetwork(t *testing.T, c *criEnv, pod, a, b string) {
	t.Helper()
	ip := podIP(t, c, pod)
	got, err := c.crictl("exec", "-s", a, "sh", "-c", "busybox ip -4 -o addr show dev eth0; busybox ip route")
	if err != nil || !strings.Contains(got, " "+ip+"/16") || !strings.Contains(got, "default via "+criCNIGateway) {
		t.Errorf("guest eth0 in container a: %q %v, want %s/16 and a default route via %s", got, err, ip, criCNIGateway)
	}

	// Test host → pod IP: a server in container a.
	if _, err := c.crictl("exec", "-s", a, "sh", "-c",
		"busybox mkdir -p /tmp/www && echo hello-over-the-pod-ip > /tmp/www/pod && busybox httpd -p 0.0.0.0:8081 -h /tmp/www"); err != nil {
		t.Errorf("start an HTTP server on the pod IP in container a: %v", err)
	} else {
		client := &http.Client{Timeout: 10 * time.Second}
		var body []byte
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Second) {
			var resp *http.Response
			if resp, err = client.Get(fmt.Sprintf("http://%s:8081/pod", ip)); err == nil {
				body, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			if err == nil && strings.TrimSpace(string(body)) == "hello-over-the-pod-ip" || time.Now().After(deadline) {
				break
			}
		}
		if err != nil || strings.TrimSpace(string(body)) != "hello-over-the-pod-ip" {
			t.Errorf("test host fetching http://%s:8081/pod from container a: %q %v", body, ip, err)
		} else {
			t.Logf("pod network: the test host reached container a's server at the pod IP %s", ip)
		}
	}

	// Pod → test host: container b reaches a server at the bridge's gateway address.
	l, err := net.Listen("tcp4", criCNIGateway+":0")
	if err != nil {
		t.Errorf("listen on the bridge gateway %s: %v", criCNIGateway, err)
		return
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello-from-the-test-host to %s\n", r.RemoteAddr)
	})}
	go srv.Serve(l)
	defer srv.Close()
	url := fmt.Sprintf("http://%s/", l.Addr())
	got, err = c.crictl("exec", "-s", b, "sh", "-c", "busybox wget -q -O - "+url+" 2>&1")
	if err != nil || !strings.Contains(got, "hello-from-the-test-host to "+ip+":") {
		t.Errorf("container b fetching %s: %q %v, want the test host's answer to %s", url, got, err, ip)
	} else {
		t.Logf("pod network: container b reached the test host's server at %s from %s", url, ip)
	}
}

// podNetworkLeftovers lists what pod networking may leave in the test host after the pod is removed:
// veths on the CNI bridge (CNI DEL removes the pod's), network namespaces CRI made.
func podNetworkLeftovers() []string {
	var left []string
	if ents, _ := os.ReadDir("/sys/class/net/" + criCNIBridge + "/brif"); len(ents) > 0 {
		for _, e := range ents {
			left = append(left, "bridge port "+e.Name())
		}
	}
	for _, d := range []string{"/var/run/netns", "/run/netns"} {
		if ents, _ := os.ReadDir(d); len(ents) > 0 {
			for _, e := range ents {
				left = append(left, "netns "+filepath.Join(d, e.Name()))
			}
		}
	}
	return left
}
