package cube

import (
	"context"
	"fmt"
	"net/url"
	"strings"
)

// Network is a sandbox's network settings at create (E2B's "network").
type Network struct {
	// AllowOut and DenyOut are CIDRs or addresses: what the sandbox may
	// reach is decided by AllowOut first, then DenyOut, then
	// AllowInternetAccess.
	AllowOut, DenyOut []string
	// AllowPublicTraffic false: the sandbox's ports (GetHost) need the API
	// key. nil: true.
	AllowPublicTraffic *bool
}

// NetworkPolicy is a sandbox's egress policy as cube-api applied it.
type NetworkPolicy struct {
	AllowInternetAccess bool              `json:"allow_internet_access"`
	AllowOut            []string          `json:"allowOut"`
	DenyOut             []string          `json:"denyOut"`
	Dropped             map[string]uint64 `json:"dropped,omitempty"`
}

// networkBody adds o's network fields to a create's body.
func (o CreateOptions) networkBody(body map[string]any) {
	if o.AllowInternetAccess != nil {
		body["allow_internet_access"] = *o.AllowInternetAccess
	}
	if n := o.Network; n != nil {
		nb := map[string]any{}
		if len(n.AllowOut) > 0 {
			nb["allowOut"] = n.AllowOut
		}
		if len(n.DenyOut) > 0 {
			nb["denyOut"] = n.DenyOut
		}
		if n.AllowPublicTraffic != nil {
			nb["allowPublicTraffic"] = *n.AllowPublicTraffic
		}
		body["network"] = nb
	}
}

// SetNetwork replaces the sandbox's egress policy while it runs.
func (s *Sandbox) SetNetwork(ctx context.Context, allowInternetAccess bool, allowOut, denyOut []string) (NetworkPolicy, error) {
	body := map[string]any{"allow_internet_access": allowInternetAccess}
	if len(allowOut) > 0 {
		body["allowOut"] = allowOut
	}
	if len(denyOut) > 0 {
		body["denyOut"] = denyOut
	}
	var p NetworkPolicy
	_, err := s.c.call(ctx, "PUT", "/sandboxes/"+url.PathEscape(s.ID)+"/network", nil, body, &p)
	return p, err
}

// GetHost is the host name under which cube-api forwards requests to the
// sandbox's port (E2B's getHost): "<port>-<sandboxID>.<domain>", the domain
// being the client URL's host. Send requests to cube-api's address with
// this Host header (or resolve *.<domain> to cube-api).
func (s *Sandbox) GetHost(port int) string {
	domain := s.c.URL
	if u, err := url.Parse(s.c.URL); err == nil && u.Host != "" {
		domain = u.Host
	}
	return fmt.Sprintf("%d-%s.%s", port, s.ID, strings.TrimPrefix(domain, "www."))
}
