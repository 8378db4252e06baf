package cube

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/checkpoint/api"
)

func (b *backend) SetNetworkPolicy(ctx context.Context, id string, p api.NetworkPolicy) (api.NetworkPolicy, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ctrs[id] == nil {
		return api.NetworkPolicy{}, errdefs.ErrNotFound
	}
	b.policy = &p
	p.Dropped = map[string]uint64{"no-internet ": 3}
	return p, nil
}

func (b *backend) Address(ctx context.Context, id string) (net.IP, error) {
	return net.IPv4(127, 0, 0, 1), nil
}

func TestNetwork(t *testing.T) {
	c, b := newClient(t)
	ctx := context.Background()
	no, yes := false, true
	sb, err := c.Create(ctx, CreateOptions{AllowInternetAccess: &no,
		Network: &Network{AllowOut: []string{"10.1.0.0/16"}, DenyOut: []string{"10.1.2.0/24"}, AllowPublicTraffic: &yes}})
	if err != nil {
		t.Fatal(err)
	}
	if n := b.network; n == nil || n.AllowInternetAccess || strings.Join(n.AllowOut, ",") != "10.1.0.0/16" || strings.Join(n.DenyOut, ",") != "10.1.2.0/24" {
		t.Errorf("create's network: %+v", n)
	}
	p, err := sb.SetNetwork(ctx, false, []string{"1.1.1.1"}, nil)
	if err != nil || p.AllowInternetAccess || strings.Join(p.AllowOut, ",") != "1.1.1.1" || p.Dropped["no-internet "] != 3 {
		t.Errorf("set: %+v %v", p, err)
	}
	if _, err := sb.SetNetwork(ctx, true, []string{"not-a-cidr"}, nil); statusOf(err) != 400 {
		t.Errorf("bad CIDR: %v", err)
	}
	if h := sb.GetHost(8080); !strings.HasPrefix(h, "8080-"+sb.ID+".127.0.0.1:") {
		t.Errorf("GetHost: %s", h)
	}
}
