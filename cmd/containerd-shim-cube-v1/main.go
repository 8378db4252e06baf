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

func main() {
	shim.RunShim(context.Background(), manager.New(manager.RuntimeName))
}
