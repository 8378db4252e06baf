package api

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/checkpoint/sandboxnet"
	"github.com/cube-runtime/cube/checkpoint/shimclient"
)

// Network modes (the config's network.mode).
const (
	// NetworkCube gives every sandbox Cube's default network (a CNI bridge
	// with NAT, through the `cube internal oci-hook` hook).
	NetworkCube = "cube"
	// NetworkNone gives sandboxes loopback only.
	NetworkNone = "none"
)

// NetworkConfig is the config's [network] table.
type NetworkConfig struct {
	// Mode is "cube" (default) or "none".
	Mode string `toml:"mode"`
	// Name is the CNI network list (<cni_conf_dir>/<name>.conflist); the
	// default "cube" is written there when missing.
	Name        string   `toml:"name"`
	CNIConfDir  string   `toml:"cni_conf_dir"`
	CNIBinDirs  []string `toml:"cni_bin_dirs"`
	CNICacheDir string   `toml:"cni_cache_dir"`
	// Hook is the `cube` binary the sandboxes' OCI hooks run ("" = the one
	// beside cube-api's executable, else `cube` on PATH).
	Hook string `toml:"hook"`
}

// DefaultNetworkConfig is the [network] table without a file.
func DefaultNetworkConfig() NetworkConfig {
	d := sandboxnet.DefaultConfig()
	return NetworkConfig{Mode: NetworkCube, Name: d.Network, CNIConfDir: d.ConfDir, CNIBinDirs: d.BinDirs, CNICacheDir: d.CacheDir}
}

// cni is the sandboxnet configuration of n.
func (n NetworkConfig) cni() sandboxnet.Config {
	return sandboxnet.Config{Network: n.Name, ConfDir: n.CNIConfDir, BinDirs: n.CNIBinDirs, CacheDir: n.CNICacheDir}
}

func (n NetworkConfig) validate() error {
	switch n.Mode {
	case NetworkNone:
		return nil
	case NetworkCube:
	default:
		return fmt.Errorf("network.mode %q: want %q (the default network) or %q (loopback only)", n.Mode, NetworkCube, NetworkNone)
	}
	for _, kv := range [][2]string{{"network.name", n.Name}, {"network.cni_conf_dir", n.CNIConfDir}, {"network.cni_cache_dir", n.CNICacheDir}} {
		if kv[1] == "" {
			return fmt.Errorf("%s is empty", kv[0])
		}
	}
	if len(n.CNIBinDirs) == 0 {
		return fmt.Errorf("network.cni_bin_dirs is empty (Debian's plugins are in /usr/lib/cni)")
	}
	return nil
}

// SandboxNet is how Containerd gives its sandboxes a network.
type SandboxNet struct {
	// Hook is the `cube` binary; CNI the network it sets up.
	Hook string
	CNI  sandboxnet.Config
}

// PrepareNetwork readies the network of cfg for the daemon: the default
// list written when missing, its plugins found, the hook binary found. nil
// (no error) for mode "none".
func PrepareNetwork(cfg NetworkConfig) (*SandboxNet, error) {
	if cfg.Mode == NetworkNone {
		return nil, nil
	}
	c := cfg.cni()
	if err := sandboxnet.EnsureConflist(c); err != nil {
		return nil, fmt.Errorf("%w (network.mode = %q turns sandbox networking off)", err, NetworkNone)
	}
	if err := sandboxnet.Check(c); err != nil {
		return nil, fmt.Errorf("%w (network.mode = %q turns sandbox networking off)", err, NetworkNone)
	}
	hook, err := findHook(cfg.Hook)
	if err != nil {
		return nil, err
	}
	return &SandboxNet{Hook: hook, CNI: c}, nil
}

func findHook(configured string) (string, error) {
	if configured != "" {
		if !filepath.IsAbs(configured) {
			return "", fmt.Errorf("network.hook %q: want an absolute path to the cube binary: %w", configured, errdefs.ErrInvalidArgument)
		}
		if _, err := os.Stat(configured); err != nil {
			return "", fmt.Errorf("network.hook: %w", err)
		}
		return configured, nil
	}
	if self, err := os.Executable(); err == nil {
		if p := filepath.Join(filepath.Dir(self), "cube"); isExecutable(p) {
			return p, nil
		}
	}
	p, err := exec.LookPath("cube")
	if err != nil {
		return "", fmt.Errorf("the sandboxes' network hook needs the cube binary: none beside cube-api nor on PATH (install it, set network.hook, or network.mode = %q): %w",
			NetworkNone, errdefs.ErrFailedPrecondition)
	}
	return filepath.Abs(p)
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// NetworkRequest is E2B's sandbox network settings (create's "network" and
// PUT …/network's body; CubeSandbox's allow_internet_access beside it).
type NetworkRequest struct {
	AllowOut []string `json:"allowOut,omitempty"`
	DenyOut  []string `json:"denyOut,omitempty"`
	// AllowPublicTraffic: the sandbox's ports are reachable through cube-api
	// without an API key (default true, as E2B's).
	AllowPublicTraffic *bool `json:"allowPublicTraffic,omitempty"`
}

// NetworkPolicyRequest is PUT /sandboxes/{id}/network's body.
type NetworkPolicyRequest struct {
	NetworkRequest
	AllowInternetAccess *bool `json:"allow_internet_access,omitempty"`
}

// NetworkPolicy is a sandbox's egress policy (what the shim enforces).
type NetworkPolicy struct {
	AllowInternetAccess bool     `json:"allow_internet_access"`
	AllowOut            []string `json:"allowOut"`
	DenyOut             []string `json:"denyOut"`
	// Dropped counts the packets each rule dropped since the policy was set.
	Dropped map[string]uint64 `json:"dropped,omitempty"`
}

// Networker is a Backend whose sandboxes have networks.
type Networker interface {
	// SetNetworkPolicy replaces sandbox id's egress policy.
	SetNetworkPolicy(ctx context.Context, id string, p NetworkPolicy) (NetworkPolicy, error)
	// Address is sandbox id's address on its network (NotFound: none).
	Address(ctx context.Context, id string) (net.IP, error)
}

// maxCIDRs bounds each list (the shim's limit).
const maxCIDRs = 256

// checkCIDRs refuses a list entry that is neither a CIDR nor an address.
func checkCIDRs(field string, l []string) error {
	if len(l) > maxCIDRs {
		return invalid("field %q: %d entries, more than %d", field, len(l), maxCIDRs)
	}
	for _, s := range l {
		if _, err := netip.ParsePrefix(s); err == nil {
			continue
		}
		if _, err := netip.ParseAddr(s); err == nil {
			continue
		}
		return invalid("field %q: %q is neither a CIDR (10.0.0.0/8) nor an address", field, s)
	}
	return nil
}

// policyOf checks a request's policy fields.
func policyOf(n NetworkRequest, allowInternet *bool) (NetworkPolicy, error) {
	p := NetworkPolicy{AllowInternetAccess: allowInternet == nil || *allowInternet, AllowOut: n.AllowOut, DenyOut: n.DenyOut}
	if err := checkCIDRs("network.allowOut", n.AllowOut); err != nil {
		return NetworkPolicy{}, err
	}
	if err := checkCIDRs("network.denyOut", n.DenyOut); err != nil {
		return NetworkPolicy{}, err
	}
	return p, nil
}

// Annotations the shim reads the sandbox's first egress policy from.
const (
	annotationAllowInternet = shimclient.AnnotationAllowInternet
	annotationAllowOut      = shimclient.AnnotationAllowOut
	annotationDenyOut       = shimclient.AnnotationDenyOut
)

// annotations is p as the shim reads it at create.
func (p NetworkPolicy) annotations() map[string]string {
	a := map[string]string{annotationAllowInternet: strconv.FormatBool(p.AllowInternetAccess)}
	if len(p.AllowOut) > 0 {
		a[annotationAllowOut] = strings.Join(p.AllowOut, ",")
	}
	if len(p.DenyOut) > 0 {
		a[annotationDenyOut] = strings.Join(p.DenyOut, ",")
	}
	return a
}

func (s *Server) setNetwork(w http.ResponseWriter, r *http.Request) error {
	var req NetworkPolicyRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	nw, ok := s.be.(Networker)
	if !ok || s.cfg.Network.Mode == NetworkNone {
		return fmt.Errorf("sandboxes have no network (network.mode = %q in cube-api's config): %w", s.cfg.Network.Mode, errdefs.ErrFailedPrecondition)
	}
	if req.AllowPublicTraffic != nil {
		return invalid("field \"allowPublicTraffic\" is set at create only")
	}
	p, err := policyOf(req.NetworkRequest, req.AllowInternetAccess)
	if err != nil {
		return err
	}
	out, err := nw.SetNetworkPolicy(r.Context(), r.PathValue("sandboxID"), p)
	if err != nil {
		return err
	}
	logOf(r).WithField("sandbox", r.PathValue("sandboxID")).WithField("allowOut", p.AllowOut).WithField("denyOut", p.DenyOut).
		WithField("internet", p.AllowInternetAccess).Info("egress policy replaced")
	writeJSON(w, http.StatusOK, out)
	return nil
}

// portHost is E2B's sandbox host name: <port>-<sandboxID>.<domain>.
var portHost = regexp.MustCompile(`^([0-9]{1,5})-([a-z0-9]{1,64})\.`)

// proxyTarget reads a port host name: the sandbox and port, or ok false.
func proxyTarget(host string) (id string, port int, ok bool) {
	m := portHost.FindStringSubmatch(strings.ToLower(host))
	if m == nil {
		return "", 0, false
	}
	port, err := strconv.Atoi(m[1])
	if err != nil || port < 1 || port > 65535 {
		return "", 0, false
	}
	return m[2], port, true
}

// proxy serves a request for <port>-<sandboxID>.<domain> (E2B's
// getHost(port)): forwarded to the sandbox's address and port. A sandbox
// made with allowPublicTraffic false needs an API key.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, id string, port int) error {
	nw, ok := s.be.(Networker)
	if !ok || s.cfg.Network.Mode == NetworkNone {
		return fmt.Errorf("host %s names port %d of sandbox %s, but sandboxes have no network (network.mode = %q): %w", r.Host, port, id, s.cfg.Network.Mode, errdefs.ErrNotFound)
	}
	c, err := s.be.Get(r.Context(), id)
	if err != nil {
		return err
	}
	if c.Labels[LabelPublic] == "false" {
		if err := s.authorize(r, route{}); err != nil {
			return fmt.Errorf("sandbox %s was made with allowPublicTraffic false: %w", id, err)
		}
	}
	ip, err := nw.Address(r.Context(), id)
	if err != nil {
		return err
	}
	target := net.JoinHostPort(ip.String(), strconv.Itoa(port))
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = target
			pr.Out.Host = r.Host
			pr.SetXForwarded()
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			s.writeError(w, r, fmt.Errorf("sandbox %s port %d (%s): %v: %w", id, port, target, err, errdefs.ErrUnavailable))
		},
	}
	rp.ServeHTTP(w, r)
	return nil
}

// Handler is the server's HTTP handler: the routes, and requests for a
// sandbox's port host name proxied to the sandbox.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, port, ok := proxyTarget(r.Host); (ok && port == EnvdPort) || (!ok && isEnvdPath(r.URL.Path)) {
			s.envd.ServeHTTP(w, r) // E2B's envd: cube-api serves it itself
			return
		}
		if id, port, ok := proxyTarget(r.Host); ok {
			s.wrap(route{Method: "*", Path: "{port}-{sandboxID}.{domain}", Public: true, Stream: true, FileBody: true,
				h: func(w http.ResponseWriter, r *http.Request) error { return s.proxy(w, r, id, port) }}).ServeHTTP(w, r)
			return
		}
		s.mux.ServeHTTP(w, r)
	})
}

// networkOf checks a create's network fields into spec (and its labels).
func (s *Server) networkOf(req *CreateSandboxRequest, spec *CreateSpec) error {
	n := NetworkRequest{}
	if req.Network != nil {
		n = *req.Network
	}
	if s.cfg.Network.Mode == NetworkNone {
		if req.Network != nil || req.AllowInternetAccess != nil {
			return invalid("fields \"network\" and \"allow_internet_access\": sandboxes have no network here (network.mode = %q in cube-api's config)", NetworkNone)
		}
		return nil
	}
	p, err := policyOf(n, req.AllowInternetAccess)
	if err != nil {
		return err
	}
	spec.Network = &p
	if n.AllowPublicTraffic != nil {
		spec.Labels[LabelPublic] = strconv.FormatBool(*n.AllowPublicTraffic)
	}
	return nil
}
