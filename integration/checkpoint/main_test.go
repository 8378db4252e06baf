// Package checkpoint is the end-to-end test of the layer above the shim, inside the test host with the real
// containerd, shim, snapshotter and VMM: the cube CLI's snapshots, rollback and fork (TestCubeSnapshots,
// TestCubeForkAndRestore), containerd's checkpoint and restore of a Cube container (TestCtrContainerRestore),
// cube-api with the Go SDK (TestCubeAPI*, TestDemo, `make demo`'s serve mode) and BenchmarkCube.
package checkpoint

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/cubetest"
)

func TestMain(m *testing.M) {
	// Timeout: the package runs about 12–15 minutes alone in a test host and up to 22 beside another one.
	s := cubetest.Setup{Name: "checkpoint", Timeout: 35 * time.Minute, Bins: map[string]string{
		// The rollback worker (static: it runs in the busybox image).
		workerBin: "github.com/cube-runtime/cube/integration/snapshot/worker",
		apiBin:    "github.com/cube-runtime/cube/cmd/cube-api",
		demoBin:   "github.com/cube-runtime/cube/contrib/sdk/go/examples/demo",
	}}
	forwards, err := demoForwards()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		os.Exit(1)
	}
	if forwards != nil {
		s.Forwards, s.Env = forwards, append(s.Env, envDemoServe+"=1")
		s.Timeout = demoServeLimit + 10*time.Minute
	}
	cubetest.Main(m, s)
}

// Daemons is cubetest's containerd, with this package's helpers as methods.
type daemons struct{ *cubetest.Daemons }

// startDaemons starts containerd with the cube runtime (cubetest.StartDaemons).
func startDaemons(tb testing.TB) *daemons { return &daemons{cubetest.StartDaemons(tb)} }
