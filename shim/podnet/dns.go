package podnet

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cube-runtime/cube/shim/sandbox"
)

// Bounds of what is sent to the agent (its own limits; glibc reads at most
// 3 nameservers and 6 search domains anyway).
const (
	maxResolvConf  = 64 << 10
	maxNameservers = 8
	maxSearch      = 32
	maxOptions     = 32
	maxWord        = 253
)

// dnsFromSpec reads the resolv.conf CRI bind-mounts at /etc/resolv.conf in
// the sandbox container's spec (nil when there is none).
func dnsFromSpec(spec *specs.Spec) (*sandbox.DNSConfig, error) {
	for _, m := range spec.Mounts {
		if path.Clean(m.Destination) != "/etc/resolv.conf" || m.Source == "" {
			continue
		}
		f, err := os.Open(m.Source)
		if err != nil {
			return nil, fmt.Errorf("pod resolv.conf %s: %w", m.Source, err)
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, maxResolvConf+1))
		if err != nil {
			return nil, fmt.Errorf("pod resolv.conf %s: %w", m.Source, err)
		}
		if len(b) > maxResolvConf {
			return nil, fmt.Errorf("pod resolv.conf %s is larger than %d bytes: %w", m.Source, maxResolvConf, errdefs.ErrInvalidArgument)
		}
		d := ParseResolvConf(b)
		return &d, nil
	}
	return nil, nil
}

// ParseResolvConf reads nameserver, search (and domain), and options lines,
// keeping what the agent accepts: IP nameservers, printable words, within
// its counts. Anything else is skipped (resolv.conf readers ignore what they
// do not understand too).
func ParseResolvConf(b []byte) sandbox.DNSConfig {
	var d sandbox.DNSConfig
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 4096), maxResolvConf)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || strings.HasPrefix(f[0], "#") || strings.HasPrefix(f[0], ";") {
			continue
		}
		switch f[0] {
		case "nameserver":
			a, err := netip.ParseAddr(f[1])
			if err == nil && a.Zone() == "" && !a.IsUnspecified() && !a.IsMulticast() && len(d.Nameservers) < maxNameservers {
				d.Nameservers = append(d.Nameservers, a.String())
			}
		case "search", "domain":
			// The last search or domain line wins, as in glibc.
			d.Search = words(f[1:], maxSearch)
		case "options":
			for _, w := range words(f[1:], maxOptions) {
				if len(d.Options) < maxOptions && !slices.Contains(d.Options, w) {
					d.Options = append(d.Options, w)
				}
			}
		}
	}
	return d
}

func words(in []string, max int) []string {
	var out []string
	for _, w := range in {
		if strings.HasPrefix(w, "#") || strings.HasPrefix(w, ";") {
			break // a comment to the end of the line
		}
		if len(w) > maxWord || strings.IndexFunc(w, func(c rune) bool { return c <= ' ' || c > '~' }) >= 0 {
			continue
		}
		if len(out) < max {
			out = append(out, w)
		}
	}
	return out
}
