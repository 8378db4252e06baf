package cubetest

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/nftables"
)

// The pod network: a bridge in the test host with the gateway address, so
// the test (in the test host's namespace) reaches pod IPs directly. No NAT
// (ipMasq): nothing leaves the test host. portmap maps a pod's hostPort
// (CRI port_mappings) to its IP, as a node's CNI chain does.
const (
	CNIBridge  = "cube-cni0"
	CNIGateway = "10.88.0.1"
	CNIName    = "cube-e2e"
	// CNILeases is host-local's default dataDir for the network: a file named by each leased address.
	CNILeases = "/var/lib/cni/networks/" + CNIName
	cniConf   = `{"cniVersion": "1.0.0", "name": "` + CNIName + `", "plugins": [{
  "type": "bridge", "bridge": "` + CNIBridge + `", "isGateway": true, "ipMasq": false,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/16", "gateway": "` + CNIGateway + `"}]],
           "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}`
)

// CRIPodNetwork writes the CNI config; the plugins must be in the test host
// (a missing one fails the test: CI installs them). It reports true: the
// pod gets a CNI network.
func CRIPodNetwork(t *testing.T, c *CRI) bool {
	for _, p := range CNIPlugins {
		if _, err := os.Stat(filepath.Join(CNIBinDir, p)); err != nil {
			t.Fatalf("CNI plugin %s not in the test host: the machine lacks Debian's containernetworking-plugins (install it: bash .ci/install.d/containerd.sh, or apt install containernetworking-plugins)", p)
		}
	}
	dir := filepath.Join(c.Dir, "net.d")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "10-cube-e2e.conflist"), []byte(cniConf), 0o644); err != nil {
		t.Fatal(err)
	}
	return true
}

// WithPodNetwork turns a pod or container config's host network (2, NODE) into the pod's own (0, POD).
func WithPodNetwork(config string) string {
	return strings.ReplaceAll(config, `"network": 2`, `"network": 0`)
}

// PodIP is the pod's address as CRI reports it (from CNI's result).
func (c *CRI) PodIP(t *testing.T, pod string) string {
	out, err := c.Crictl("inspectp", "-o", "json", pod)
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

// PodNetworkLeftovers lists what pod networking may leave in the test host after the pod is removed:
// veths on the CNI bridge (CNI DEL removes the pod's), network namespaces CRI made (the VM's tap lives in
// the pod's), host-local's address leases, egress policy tables (nftables).
func PodNetworkLeftovers() []string {
	var left []string
	if ents, _ := os.ReadDir(CNILeases); len(ents) > 0 {
		for _, e := range ents {
			if net.ParseIP(e.Name()) != nil {
				left = append(left, "address lease "+e.Name())
			}
		}
	}
	if conn, err := nftables.New(); err != nil {
		left = append(left, fmt.Sprintf("nftables: %v", err))
	} else if tables, err := conn.ListTablesOfFamily(nftables.TableFamilyNetdev); err != nil {
		left = append(left, fmt.Sprintf("nftables tables: %v", err))
	} else {
		for _, tb := range tables {
			if strings.HasPrefix(tb.Name, "cube-egress-") {
				left = append(left, "nftables table "+tb.Name)
			}
		}
	}
	if ents, _ := os.ReadDir("/sys/class/net/" + CNIBridge + "/brif"); len(ents) > 0 {
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
