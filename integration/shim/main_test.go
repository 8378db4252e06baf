// Package shim is the shim's end-to-end test: inside the test host, the
// shim's task service (shim/task, the code containerd drives through
// containerd-shim-cube-v1) runs containers in microVMs with the real
// cube-vmm, the real guest agent and the guest image, over real containerd
// fifos. containerd itself is not in the loop yet (see docs/shim.md).
package shim

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/sandboxenv"
	"github.com/cube-runtime/cube/integration/testhost"
)

func TestMain(m *testing.M) {
	if testhost.Inside() {
		os.Exit(m.Run())
	}
	// Decide before building anything: -short leaves the test host out.
	flag.Parse()
	if testing.Short() {
		fmt.Println("SKIP: the shim's end-to-end tests run in the QEMU test host, which -short leaves out (run `make e2e-shim`)")
		os.Exit(0)
	}
	env, err := sandboxenv.Prepare("cube-shim-e2e-", map[string]string{
		ShimBin:        "github.com/cube-runtime/cube/cmd/containerd-shim-cube-v1",
		SnapshotterBin: "github.com/cube-runtime/cube/cmd/cube-snapshotter",
		CubeBin:        "github.com/cube-runtime/cube/cmd/cube",
		// TestCubeSnapshots' rollback worker (static: it runs in the busybox image).
		workerBin: "github.com/cube-runtime/cube/integration/snapshot/worker",
		apiBin:    "github.com/cube-runtime/cube/cmd/cube-api",
		demoBin:   "github.com/cube-runtime/cube/contrib/sdk/go/examples/demo",
	})
	if err == nil {
		err = WriteImageTar(env)
	}
	if err == nil {
		// The CRI test's containerd imports the contrib snippet as shipped.
		env.Files[CRIContribConfig], err = filepath.Abs("../../contrib/containerd/cube-runtime.toml")
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: prepare guest artifacts: %v\n", err)
		if env != nil {
			env.Close()
		}
		os.Exit(1)
	}
	// containerd and ctr come from the machine (.ci/install.d/containerd.sh);
	// without them TestCtrRun skips inside the test host and says so.
	for dst, name := range map[string]string{ContainerdBin: "containerd", CtrBin: "ctr", CrictlBin: "crictl",
		"/cube/bin/containerd-shim-runc-v2": "containerd-shim-runc-v2", "/cube/bin/runc": "runc"} {
		if p, err := exec.LookPath(name); err == nil {
			env.Files[dst] = p
		}
	}
	// CNI plugins for the CRI pod's network (Debian's containernetworking-plugins, installed by
	// .ci/install.d/containerd.sh); without them the CRI test's pod is host-network and says so.
	for _, name := range CNIPlugins {
		if p := filepath.Join("/usr/lib/cni", name); FileExists(p) {
			env.Files[filepath.Join(CNIBinDir, name)] = p
		}
	}
	var envs []string
	if v := os.Getenv("CUBE_E2E_VMM_KILL"); v != "" {
		envs = append(envs, "CUBE_E2E_VMM_KILL="+v) // =running: TestCtrVMMKilled kills a running VMM
	}
	forwards, err := demoForwards()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		env.Close()
		os.Exit(1)
	}
	if forwards != nil {
		envs = append(envs, envDemoServe+"=1")
	}
	code := testhost.RunMain(m, testhost.Options{
		Env:     envs,
		Timeout: 25 * time.Minute,
		Files:   env.Files,
		// The snapshotter makes ext4 images; containerd's diff applier
		// loop-mounts them to unpack layers. containerd's CRI CheckpointContainer refuses to run without a
		// criu binary of a minimum version, even for a runtime that does not use it (TestCRICheckpointPodVM).
		Tools: []string{"mkfs.ext4", "debugfs", "criu"},
		// CRI pod networking: veth + bridge (CNI's bridge plugin), the VM's tap and the tc redirects; egress policies.
		Modules:  []string{"loop", "overlay", "tun", "veth", "bridge", "sch_ingress", "cls_u32", "act_mirred", "nf_tables"},
		Forwards: forwards,
	})
	env.Close() // not deferred: os.Exit skips deferred calls
	os.Exit(code)
}
