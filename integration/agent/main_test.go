// Package agent is the guest agent's end-to-end test: inside the test host, cube-vmm boots the guest image
// (`make guest`: Debian's cloud kernel + the agent as /init) with an ext4 rootfs disk built from
// busybox-static, and the test drives the agent over hybrid vsock as the shim will.
package agent

import (
	"testing"

	"github.com/cube-runtime/cube/integration/sandboxenv"
)

// Paths inside the test host.
const (
	cubeVMM     = sandboxenv.CubeVMM
	guestKernel = sandboxenv.GuestKernel
	guestInitrd = sandboxenv.GuestInitrd
	rootfsImage = sandboxenv.RootfsImage
)

func TestMain(m *testing.M) { sandboxenv.Main(m, "cube-agent-e2e-") }
