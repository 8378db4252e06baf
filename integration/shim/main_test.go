// Package shim is the shim's end-to-end test, inside the test host: the task service (shim/task) with the
// real cube-vmm, guest agent and image over real fifos, then containerd 2.4.2 with the cube snapshotter and
// io.cube.v1 through ctr and CRI (crictl): tasks, pods, volumes, networks, templates. The layer above the shim
// (snapshots, restore, fork, cube-api) is integration/checkpoint.
package shim

import (
	"os"
	"testing"

	"github.com/cube-runtime/cube/integration/cubetest"
)

func TestMain(m *testing.M) {
	s := cubetest.Setup{Name: "shim", Bins: map[string]string{
		fsbenchBin: "github.com/cube-runtime/cube/integration/shim/fsbench", // BenchmarkVirtioFS, in the guest
	}}
	if v := os.Getenv("CUBE_E2E_VMM_KILL"); v != "" {
		s.Env = append(s.Env, "CUBE_E2E_VMM_KILL="+v) // =running: TestCtrVMMKilled kills a running VMM
	}
	if v := os.Getenv(guestProfileEnv); v != "" {
		s.Env = append(s.Env, guestProfileEnv+"="+v) // BenchmarkFirstTouch samples guest RIPs
	}
	cubetest.Main(m, s)
}

// Daemons is cubetest's containerd, with this package's helpers as methods.
type daemons struct{ *cubetest.Daemons }

// startDaemons starts containerd with the cube runtime (cubetest.StartDaemons).
func startDaemons(tb testing.TB) *daemons { return &daemons{cubetest.StartDaemons(tb)} }
