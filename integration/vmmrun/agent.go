package vmmrun

import (
	"context"
	"testing"
	"time"

	"github.com/containerd/ttrpc"

	"github.com/cube-runtime/cube/guest-agent/protocol"
	"github.com/cube-runtime/cube/hypervisor/vsockdial"
)

// DialAgent connects to the guest agent of this VM through its hybrid vsock socket uds, retrying until the
// agent answers Version (it may still be booting, or reconnecting after a restore) or timeout passes, which
// fails the test with the console and stderr. The caller closes the returned ttrpc client.
func (p *Process) DialAgent(t testing.TB, uds string, timeout time.Duration) (*ttrpc.Client, protocol.AgentService) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := vsockdial.Dial(c, uds, protocol.AgentPort)
		if err == nil {
			tc := ttrpc.NewClient(conn)
			cl := protocol.NewAgentClient(tc)
			if _, err = cl.Version(c, &protocol.VersionRequest{}); err == nil {
				cancel()
				return tc, cl
			}
			tc.Close()
		}
		cancel()
		if time.Now().After(deadline) {
			t.Fatalf("agent never answered on %s: %v\nconsole:\n%s\nstderr:\n%s", uds, err, p.ConsoleTail(), p.Stderr())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
