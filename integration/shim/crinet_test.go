package shim

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/cubetest"
)

const (
	criCNIBridge  = cubetest.CNIBridge
	criCNIGateway = cubetest.CNIGateway
)

func withPodNetwork(config string) string { return cubetest.WithPodNetwork(config) }

func podIP(t *testing.T, c *criEnv, pod string) string { return c.PodIP(t, pod) }

func podNetworkLeftovers() []string { return cubetest.PodNetworkLeftovers() }

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
