package shim

import (
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

const (
	criCNIBridge  = cubetest.CNIBridge
	criCNIGateway = cubetest.CNIGateway
	criCNILeases  = cubetest.CNILeases
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
	// host-local's lease of the pod IP (podNetworkLeftovers looks for leases there after the pod goes).
	if _, err := os.Stat(filepath.Join(criCNILeases, ip)); err != nil {
		t.Errorf("no address lease for the pod IP: %v", err)
	}
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

// checkPodToPod: a second pod on the same CNI network (its own VM, its own
// pod IP) and the first reach each other by pod IP, through the bridge
// (no NAT: each server sees the other pod's address): a container of the
// second pod fetches from the server checkPodNetwork started in container
// a of the first (port 8081), and container b of the first fetches from a
// server in the second. The second pod is then removed; its veth and
// namespace go (podNetworkLeftovers at the end of the test covers the rest).
func checkPodToPod(t *testing.T, c *criEnv, pod, a, b string) {
	t.Helper()
	ip := podIP(t, c, pod)
	podJSON := filepath.Join(c.Dir, "pod2.json")
	os.WriteFile(podJSON, fmt.Appendf(nil, strings.ReplaceAll(withPodNetwork(criPodConfig), "cube-pod", "cube-pod2"), filepath.Join(c.Dir, "pod2logs")), 0o644)
	out, err := c.crictl("runp", "--runtime", "cube", podJSON)
	if err != nil {
		t.Errorf("second pod: %v", err)
		return
	}
	pod2 := strings.TrimSpace(out)
	removed := false
	remove := func() {
		if !removed {
			removed = true
			c.crictl("stopp", pod2)
			c.crictl("rmp", "-f", pod2)
		}
	}
	defer remove()
	cj := filepath.Join(c.Dir, "p2.json")
	os.WriteFile(cj, fmt.Appendf(nil, withPodNetwork(criContainerConfig), "p2", cubetest.ImageRef), 0o644)
	out, err = c.crictl("create", pod2, cj, podJSON)
	if err != nil {
		t.Errorf("container in the second pod: %v", err)
		return
	}
	p2 := strings.TrimSpace(out)
	if _, err := c.crictl("start", p2); err != nil {
		t.Errorf("start the second pod's container: %v", err)
		return
	}
	ip2 := podIP(t, c, pod2)
	if ip2 == ip {
		t.Errorf("both pods have the address %s", ip)
	}
	// fetch has container id get url (retrying while the other side's server starts).
	fetch := func(id, url, want string) (string, error) {
		var got string
		var err error
		for range 10 {
			if got, err = c.crictl("exec", "-s", id, "sh", "-c", "busybox timeout 10 busybox wget -q -O - "+url+" 2>&1"); err == nil && strings.Contains(got, want) {
				return got, nil
			}
			time.Sleep(time.Second)
		}
		return got, err
	}
	// Second pod → first: container a's server (checkPodNetwork started it on 8081).
	url := fmt.Sprintf("http://%s:8081/pod", ip)
	if got, err := fetch(p2, url, "hello-over-the-pod-ip"); err != nil || !strings.Contains(got, "hello-over-the-pod-ip") {
		t.Errorf("the second pod (%s) fetching %s from the first: %q %v", ip2, url, got, err)
	} else {
		t.Logf("pod to pod: the second pod (%s) reached the first's server at %s", ip2, url)
	}
	// First → second: a server in the second pod's container, answering with the client's address
	// (busybox httpd's CGI gets REMOTE_ADDR): the first pod's own IP, not a NATed one.
	if _, err := c.crictl("exec", "-s", p2, "sh", "-c",
		`busybox mkdir -p /tmp/www/cgi-bin && busybox printf '#!/bin/sh\necho Content-Type: text/plain\necho\necho hello-from-pod2 to $REMOTE_ADDR\n' > /tmp/www/cgi-bin/who && busybox chmod +x /tmp/www/cgi-bin/who && busybox httpd -p 0.0.0.0:8082 -h /tmp/www`); err != nil {
		t.Errorf("start a server in the second pod: %v", err)
	} else {
		url := fmt.Sprintf("http://%s:8082/cgi-bin/who", ip2)
		want := "hello-from-pod2 to " + ip
		if got, err := fetch(b, url, want); err != nil || !strings.Contains(got, want) {
			t.Errorf("container b of the first pod fetching %s: %q %v, want %q", url, got, err, want)
		} else {
			t.Logf("pod to pod: the first pod reached the second's server at %s, which saw %s", url, ip)
		}
	}

	ports := func() int { ents, _ := os.ReadDir("/sys/class/net/" + criCNIBridge + "/brif"); return len(ents) }
	before := ports()
	if _, err := c.crictl("stopp", pod2); err != nil {
		t.Errorf("stopp the second pod: %v", err)
	}
	if _, err := c.crictl("rmp", pod2); err != nil {
		t.Errorf("rmp the second pod: %v", err)
	}
	removed = true
	n := ports()
	for deadline := time.Now().Add(30 * time.Second); n != before-1 && time.Now().Before(deadline); n = ports() {
		time.Sleep(time.Second)
	}
	if n != before-1 {
		t.Errorf("bridge ports after the second pod was removed: %d, were %d (its veth must go, the first's stay)", n, before)
	}
}
