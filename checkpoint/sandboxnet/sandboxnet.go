// Package sandboxnet is the default network of the sandboxes cube-api makes
// (and of any io.cube.v1 container whose spec carries its hooks): a CNI
// network list — by default a bridge with NAT (`cube0`, 10.98.0.0/16) and
// the portmap plugin for exposed ports — set up by an OCI createRuntime hook
// and torn down by a poststop hook, the way nerdctl's `nerdctl internal
// oci-hook` does for runc. The shim runs those hooks on the host against a
// network namespace it holds and connects what CNI made there to the VM
// (shim/podnet.HookNetwork); the egress policy of shim/egress applies to it
// as to a CRI pod's network.
//
// The hook is `cube internal oci-hook createRuntime|poststop` (checkpoint/cli
// wires it); everything it needs is in its arguments and the OCI state on
// its stdin, so it keeps no state of its own besides CNI's cache.
package sandboxnet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Defaults (docs/api.md, "Network").
const (
	DefaultNetwork  = "cube"
	DefaultConfDir  = "/etc/cube/cni"
	DefaultCacheDir = "/var/lib/cube/cni"
	DefaultBridge   = "cube0"
	DefaultSubnet   = "10.98.0.0/16"
	// IfName is the interface CNI makes in the sandbox's namespace (the
	// shim redirects it to the VM's tap; the guest's NIC takes its address).
	IfName = "eth0"
)

// DefaultBinDirs are searched for CNI plugins (Debian's
// containernetworking-plugins, then the upstream tarball's place).
var DefaultBinDirs = []string{"/usr/lib/cni", "/opt/cni/bin"}

// AnnotationPorts lists a sandbox's exposed ports as
// HOSTPORT:SANDBOXPORT[/tcp|/udp], comma-separated (the portmap plugin maps
// each host port to the sandbox's address).
const AnnotationPorts = "io.cube.network.ports"

// Config names a CNI network list and where its plugins and cache are.
type Config struct {
	// Network is the list's name; its file is ConfDir/<Network>.conflist.
	Network string
	ConfDir string
	BinDirs []string
	// CacheDir holds CNI's results (the sandbox's address) and host-local's
	// leases of the default list.
	CacheDir string
}

// DefaultConfig is the default network.
func DefaultConfig() Config {
	return Config{Network: DefaultNetwork, ConfDir: DefaultConfDir, BinDirs: DefaultBinDirs, CacheDir: DefaultCacheDir}
}

// Args are the hook's arguments that carry c (Parse reads them back).
func (c Config) Args() []string {
	return []string{"--network", c.Network, "--cni-conf-dir", c.ConfDir, "--cni-bin-dir", strings.Join(c.BinDirs, ":"), "--cni-cache-dir", c.CacheDir}
}

func (c Config) confFile() string { return filepath.Join(c.ConfDir, c.Network+".conflist") }

// DefaultConflist is the default network list: a bridge with NAT to the
// host's other networks, host-local addresses, and portmap.
func DefaultConflist(c Config) []byte {
	return []byte(fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": %q,
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": %q
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}
  ]
}
`, c.Network, DefaultBridge, DefaultSubnet, filepath.Join(c.CacheDir, "ipam")))
}

// EnsureConflist writes the default list when c names the default network
// and its file is missing (an existing file is the user's and is kept).
// Another network's file must exist.
func EnsureConflist(c Config) error {
	if _, err := os.Stat(c.confFile()); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("network %s: %w", c.Network, err)
	}
	if c.Network != DefaultNetwork {
		return fmt.Errorf("network %q: no %s (write the CNI network list there, or use the default network %q): %w",
			c.Network, c.confFile(), DefaultNetwork, errdefs.ErrNotFound)
	}
	if err := os.MkdirAll(c.ConfDir, 0o755); err != nil {
		return fmt.Errorf("default network: %w", err)
	}
	tmp := c.confFile() + ".tmp"
	if err := os.WriteFile(tmp, DefaultConflist(c), 0o644); err != nil {
		return fmt.Errorf("default network: %w", err)
	}
	if err := os.Rename(tmp, c.confFile()); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("default network: %w", err)
	}
	return nil
}

// Check loads the list and finds its plugins: what a sandbox's create would
// fail on, said at once (cube-api checks it at start).
func Check(c Config) error {
	list, err := libcni.ConfListFromFile(c.confFile())
	if err != nil {
		return fmt.Errorf("network %s (%s): %w", c.Network, c.confFile(), err)
	}
	for _, p := range list.Plugins {
		found := false
		for _, d := range c.BinDirs {
			if _, err := os.Stat(filepath.Join(d, p.Network.Type)); err == nil {
				found = true
				break
			}
		}
		if !found {
			return fmt.Errorf("network %s: CNI plugin %q is in none of %v (install Debian's containernetworking-plugins, or set the plugin directories): %w",
				c.Network, p.Network.Type, c.BinDirs, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// PortMapping is one exposed port (CNI's portMappings capability).
type PortMapping struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"`
}

// ParsePorts reads AnnotationPorts' value ("" = none).
func ParsePorts(v string) ([]PortMapping, error) {
	var out []PortMapping
	seen := map[string]bool{}
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		spec, proto, hasProto := strings.Cut(f, "/")
		if !hasProto {
			proto = "tcp"
		}
		if proto != "tcp" && proto != "udp" {
			return nil, fmt.Errorf("port %q: protocol %q: want tcp or udp: %w", f, proto, errdefs.ErrInvalidArgument)
		}
		hs, cs, ok := strings.Cut(spec, ":")
		if !ok {
			return nil, fmt.Errorf("port %q: want HOSTPORT:SANDBOXPORT[/tcp|/udp]: %w", f, errdefs.ErrInvalidArgument)
		}
		h, herr := strconv.Atoi(hs)
		p, cerr := strconv.Atoi(cs)
		if herr != nil || cerr != nil || h < 1 || h > 65535 || p < 1 || p > 65535 {
			return nil, fmt.Errorf("port %q: ports are numbers 1..65535: %w", f, errdefs.ErrInvalidArgument)
		}
		key := hs + "/" + proto
		if seen[key] {
			return nil, fmt.Errorf("port %q: host port %d/%s given twice: %w", f, h, proto, errdefs.ErrInvalidArgument)
		}
		seen[key] = true
		out = append(out, PortMapping{HostPort: h, ContainerPort: p, Protocol: proto})
	}
	return out, nil
}

// FormatPorts is ParsePorts' inverse.
func FormatPorts(ps []PortMapping) string {
	var parts []string
	for _, p := range ps {
		parts = append(parts, fmt.Sprintf("%d:%d/%s", p.HostPort, p.ContainerPort, p.Protocol))
	}
	return strings.Join(parts, ",")
}

// maxState bounds the OCI state a hook reads (its annotations included).
const maxState = 1 << 20

// ReadState reads the OCI state a runtime gives a hook on stdin.
func ReadState(r io.Reader) (specs.State, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxState+1))
	if err != nil {
		return specs.State{}, fmt.Errorf("read the OCI state: %w", err)
	}
	if len(b) > maxState {
		return specs.State{}, fmt.Errorf("the OCI state on stdin is over %d bytes: %w", maxState, errdefs.ErrInvalidArgument)
	}
	var st specs.State
	if err := json.Unmarshal(b, &st); err != nil {
		return specs.State{}, fmt.Errorf("the OCI state on stdin: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if st.ID == "" {
		return specs.State{}, fmt.Errorf("the OCI state on stdin has no id: %w", errdefs.ErrInvalidArgument)
	}
	return st, nil
}

func (c Config) cni() *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir(c.BinDirs, c.CacheDir, nil)
}

func (c Config) list() (*libcni.NetworkConfigList, error) {
	list, err := libcni.ConfListFromFile(c.confFile())
	if err != nil {
		return nil, fmt.Errorf("network %s (%s): %w", c.Network, c.confFile(), err)
	}
	return list, nil
}

// Add is the createRuntime (or prestart) hook: CNI ADD of the list in the
// network namespace of the state's pid, with the exposed ports of its
// annotations. It returns CNI's result.
func Add(ctx context.Context, c Config, st specs.State) (*types100.Result, error) {
	if st.Pid <= 0 {
		return nil, fmt.Errorf("sandbox %s: the OCI state has no pid (run this as a createRuntime or prestart hook): %w", st.ID, errdefs.ErrInvalidArgument)
	}
	ports, err := ParsePorts(st.Annotations[AnnotationPorts])
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: annotation %s: %w", st.ID, AnnotationPorts, err)
	}
	list, err := c.list()
	if err != nil {
		return nil, err
	}
	rt := &libcni.RuntimeConf{ContainerID: st.ID, NetNS: fmt.Sprintf("/proc/%d/ns/net", st.Pid), IfName: IfName}
	if len(ports) > 0 {
		rt.CapabilityArgs = map[string]interface{}{"portMappings": ports}
	}
	res, err := c.cni().AddNetworkList(ctx, list, rt)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: CNI ADD of network %s: %w", st.ID, c.Network, err)
	}
	r, err := types100.NewResultFromResult(res)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: CNI's result: %w", st.ID, err)
	}
	return r, nil
}

// Del is the poststop hook: CNI DEL with what ADD cached (the address is
// released, the exposed ports unmapped). It succeeds when ADD never ran.
func Del(ctx context.Context, c Config, st specs.State) error {
	list, err := c.list()
	if err != nil {
		return err
	}
	rt := &libcni.RuntimeConf{ContainerID: st.ID, IfName: IfName}
	if st.Pid > 0 {
		ns := fmt.Sprintf("/proc/%d/ns/net", st.Pid)
		if _, err := os.Stat(ns); err == nil {
			rt.NetNS = ns
		}
	}
	cni := c.cni()
	if _, cached, err := cni.GetNetworkListCachedConfig(list, rt); err == nil && cached != nil {
		rt.CapabilityArgs = cached.CapabilityArgs
	}
	if err := cni.DelNetworkList(ctx, list, rt); err != nil {
		return fmt.Errorf("sandbox %s: CNI DEL of network %s: %w", st.ID, c.Network, err)
	}
	return nil
}

// Address is the IPv4 address the network gave sandbox id (from CNI's
// cache); NotFound when it has none.
func Address(c Config, id string) (net.IP, error) {
	list, err := c.list()
	if err != nil {
		return nil, err
	}
	res, err := c.cni().GetNetworkListCachedResult(list, &libcni.RuntimeConf{ContainerID: id, IfName: IfName})
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: CNI's cached result: %w", id, err)
	}
	if res == nil {
		return nil, fmt.Errorf("sandbox %s has no address on network %s: %w", id, c.Network, errdefs.ErrNotFound)
	}
	r, err := types100.NewResultFromResult(res)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: CNI's cached result: %w", id, err)
	}
	for _, ip := range r.IPs {
		if v4 := ip.Address.IP.To4(); v4 != nil {
			return v4, nil
		}
	}
	return nil, fmt.Errorf("sandbox %s has no IPv4 address on network %s: %w", id, c.Network, errdefs.ErrNotFound)
}
