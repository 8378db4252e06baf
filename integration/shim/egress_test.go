package shim

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/nftables"

	"github.com/cube-runtime/cube/checkpoint/cli"
	"github.com/cube-runtime/cube/integration/cubetest"
)

// egressOtherAddr is a second address of the test host (on lo), outside the
// pod network: the pod reaches it through its default route via the bridge.
const egressOtherAddr = "10.77.0.1"

// cube runs the cube CLI against the CRI containerd (namespace k8s.io).
func (c *criEnv) cube(args ...string) (string, error) {
	return c.run(cubetest.CubeBin, append([]string{"--address", c.Dir + "/containerd.sock", "--namespace", "k8s.io",
		"--state", c.Dir + "/state"}, args...)...)
}

// egressTables lists the test host's nftables tables of egress policies.
func egressTables(t *testing.T) []string {
	t.Helper()
	conn, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyNetdev)
	if err != nil {
		t.Fatalf("list nftables tables: %v", err)
	}
	var names []string
	for _, tb := range tables {
		if strings.HasPrefix(tb.Name, "cube-egress-") {
			names = append(names, tb.Name)
		}
	}
	return names
}

// TestCRIPodEgressPolicy: a CRI pod (CNI bridge) reaches two HTTP servers
// of the test host, A at the bridge's gateway and B at another address.
// `cube network policy POD --no-internet --allow-out A`: A answers, B is
// never reached (its server counts no request), the drops are counted;
// changed while the pod runs to allow B only: B answers, A is not reached.
// A bad CIDR is refused naming its field. Removing the pod removes the
// nftables table.
func TestCRIPodEgressPolicy(t *testing.T) {
	c := startCRI(t)
	if out, err := exec.Command("/bin/busybox", "ip", "addr", "add", egressOtherAddr+"/32", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("add %s to lo: %v: %s", egressOtherAddr, err, out)
	}
	t.Cleanup(func() { exec.Command("/bin/busybox", "ip", "addr", "del", egressOtherAddr+"/32", "dev", "lo").Run() })

	podJSON := filepath.Join(c.Dir, "pod.json")
	os.WriteFile(podJSON, fmt.Appendf(nil, withPodNetwork(criPodConfig), filepath.Join(c.Dir, "podlogs")), 0o644)
	out, err := c.crictl("runp", "--runtime", "cube", podJSON)
	if err != nil {
		t.Fatal(err)
	}
	pod := strings.TrimSpace(out)
	podRemoved := false
	t.Cleanup(func() {
		if !podRemoved {
			c.crictl("stopp", pod)
			c.crictl("rmp", "-f", pod)
		}
	})
	cj := filepath.Join(c.Dir, "c1.json")
	os.WriteFile(cj, fmt.Appendf(nil, withPodNetwork(criContainerConfig), "c1", cubetest.ImageRef), 0o644)
	out, err = c.crictl("create", pod, cj, podJSON)
	if err != nil {
		t.Fatal(err)
	}
	ctr := strings.TrimSpace(out)
	if _, err := c.crictl("start", ctr); err != nil {
		t.Fatal(err)
	}

	a, b := cubetest.NewCountingServer(t, criCNIGateway), cubetest.NewCountingServer(t, egressOtherAddr)
	// fetch has the container get url; a denied connection hangs (its SYN is dropped) until timeout ends it.
	fetch := func(s *cubetest.CountingServer) bool {
		t.Helper()
		got, _ := c.crictl("exec", "-s", ctr, "sh", "-c", "busybox timeout 5 busybox wget -q -O - "+s.URL+" 2>&1; echo rc=$?")
		return strings.Contains(got, "hello-from") && strings.Contains(got, "rc=0")
	}
	reachable := func(s *cubetest.CountingServer) bool {
		for range 3 {
			if fetch(s) {
				return true
			}
		}
		return false
	}
	if !reachable(a) || !reachable(b) {
		t.Fatalf("without a policy the pod must reach both servers (A %s: %d requests, B %s: %d)", a.URL, a.Hits.Load(), b.URL, b.Hits.Load())
	}

	policy := func(args ...string) cli.NetworkPolicy {
		t.Helper()
		out, err := c.cube(append([]string{"network", "policy", pod, "--json"}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		var np cli.NetworkPolicy
		if err := json.Unmarshal([]byte(out), &np); err != nil {
			t.Fatalf("cube network policy --json: %v: %s", err, out)
		}
		return np
	}
	dropped := func(np cli.NetworkPolicy) uint64 {
		for _, ct := range np.Counters {
			if ct.Action == "no-internet" && ct.CIDR == "0.0.0.0/0" {
				return ct.Packets
			}
		}
		return 0
	}
	// check: the allowed server answers, the denied one never sees a request, and the drops are counted.
	check := func(allowed, denied *cubetest.CountingServer, name string) {
		t.Helper()
		before := denied.Hits.Load()
		if !fetch(allowed) {
			t.Errorf("%s: the allowed server %s did not answer", name, allowed.URL)
		}
		if fetch(denied) {
			t.Errorf("%s: the denied server %s answered", name, denied.URL)
		}
		if n := denied.Hits.Load(); n != before {
			t.Errorf("%s: the denied server %s got %d requests", name, denied.URL, n-before)
		}
		if np := policy(); np.AllowInternetAccess || dropped(np) == 0 {
			t.Errorf("%s: policy %+v: want internet denied and the dropped packets counted", name, np)
		}
	}

	np := policy("--no-internet", "--allow-out", criCNIGateway)
	if len(np.AllowOut) != 1 || np.AllowOut[0] != criCNIGateway+"/32" || np.Device == "" {
		t.Fatalf("policy set: %+v", np)
	}
	if tabs := egressTables(t); len(tabs) != 1 {
		t.Errorf("egress tables while the policy is set: %v, want the pod's", tabs)
	}
	check(a, b, "allow-out A")
	// Changed while the pod runs: the chain's rules replaced in one transaction.
	policy("--no-internet", "--allow-out", egressOtherAddr)
	check(b, a, "allow-out B")

	// Bad input: refused naming the field; the policy in force stays.
	if out, err := c.cube("network", "policy", pod, "--allow-out", "10.0.0.0/8,10.0.0.300"); err == nil || !strings.Contains(err.Error(), "allow_out[1]") {
		t.Errorf("a bad CIDR: %q %v, want a refusal naming allow_out[1]", out, err)
	}
	if np := policy(); np.AllowInternetAccess || len(np.AllowOut) != 1 || np.AllowOut[0] != egressOtherAddr+"/32" {
		t.Errorf("policy after a refused change: %+v", np)
	}

	if _, err := c.crictl("stopp", pod); err != nil {
		t.Fatal(err)
	}
	if _, err := c.crictl("rmp", pod); err != nil {
		t.Fatal(err)
	}
	podRemoved = true
	if tabs := egressTables(t); len(tabs) != 0 {
		t.Errorf("egress tables left after the pod was removed: %v", tabs)
	}
	if left := podNetworkLeftovers(); len(left) > 0 {
		t.Errorf("pod network leftovers: %v", left)
	}
}
