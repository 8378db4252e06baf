// Package critest runs cri-tools' CRI validation suite (critest v1.37.0) in the test host against containerd
// 2.4.2 with its CRI plugin: once with containerd's default runc handler, once with `--runtime-handler cube`,
// and compares the two (TestCritest). The images critest pulls come from a registry in the test host
// (cmd/cube-testregistry, integration/critest/testimages); skip.txt lists what Cube, the test host or the
// local images cannot do, with the reason.
//
// By default a subset of the suite runs (defaultFocus: it fits `make test`'s budget); CUBE_CRITEST_FULL=1
// (`make critest`) runs all of it.
package critest

import (
	"os"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/cubetest"
)

// RegistryBin is cmd/cube-testregistry in the test host.
const RegistryBin = "/cube/bin/cube-testregistry"

func TestMain(m *testing.M) {
	s := cubetest.Setup{
		Name: "critest",
		Bins: map[string]string{RegistryBin: "github.com/cube-runtime/cube/cmd/cube-testregistry"},
		// ipcmk: critest's HostIpc specs make a shared memory segment on the node with it (util-linux).
		Programs: map[string]string{cubetest.CritestBin: "critest", "/cube/bin/ipcmk": "ipcmk"},
	}
	if f := os.Getenv("CUBE_CRITEST_FOCUS"); f != "" {
		s.Env = append(s.Env, "CUBE_CRITEST_FOCUS="+f) // a --ginkgo.focus regexp instead of defaultFocus
	}
	if full() {
		s.Env = append(s.Env, "CUBE_CRITEST_FULL=1")
		s.Timeout = 175 * time.Minute // two runs of at most 85 minutes (TestCritest)
	}
	cubetest.Main(m, s)
}

// full: CUBE_CRITEST_FULL=1 asks for the whole suite.
func full() bool { return os.Getenv("CUBE_CRITEST_FULL") == "1" }
