// Command cube takes and manages whole-VM snapshots of io.cube.v1
// containers. See `cube --help` and docs/cli.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/cube-runtime/cube/checkpoint/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], cli.ProcessEnv())
	stop()
	os.Exit(code)
}
