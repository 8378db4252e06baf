package sandboxtest

import (
	"context"

	"github.com/cube-runtime/cube/shim/sandbox"
)

// ConfigureNetwork implements sandbox.AgentClient: it records the
// configuration (Networks) and fails with NetworkErr when set.
func (a *Agent) ConfigureNetwork(ctx context.Context, c sandbox.NetworkConfig) error {
	if err := a.enter("ConfigureNetwork"); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.NetworkErr != nil {
		return a.NetworkErr
	}
	a.networks = append(a.networks, c)
	return nil
}

// Networks returns the configurations ConfigureNetwork received, in order.
func (a *Agent) Networks() []sandbox.NetworkConfig {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]sandbox.NetworkConfig(nil), a.networks...)
}
