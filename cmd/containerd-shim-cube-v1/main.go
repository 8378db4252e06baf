// Command containerd-shim-cube-v1 is the containerd runtime shim for
// io.cube.v1: every sandbox runs in its own microVM.
package main

import (
	"context"

	"github.com/containerd/containerd/v2/pkg/shim"

	_ "github.com/cube-runtime/cube/shim/filessvc/plugin"
	"github.com/cube-runtime/cube/shim/manager"
	_ "github.com/cube-runtime/cube/shim/snapshotsvc/plugin"
	_ "github.com/cube-runtime/cube/shim/task/plugin"
)

// ownChildren: the shim waits for every process it starts itself (cube-vmm, the OCI hooks, stdio logging
// binaries: os/exec), so containerd's shim library must neither reap children behind its back nor make the
// shim a subreaper. Its reaper answers each SIGCHLD with wait4(-1), which raced os/exec's wait for a short
// process: a createRuntime hook that succeeded failed the sandbox's create with "waitid: no child processes"
// (seen creating a sandbox from a snapshot through cube-api). runc's shim needs both for the processes runc
// leaves behind; the shim has none: the workload runs in the guest. An orphan of a child (a hook's CNI
// plugin whose hook was killed) goes to the nearest subreaper or init, which reaps it.
func ownChildren(c *shim.Config) {
	c.NoReaper = true
	c.NoSubreaper = true
}

func main() {
	shim.RunShim(context.Background(), manager.New(manager.RuntimeName), ownChildren)
}
