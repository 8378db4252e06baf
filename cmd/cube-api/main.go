// Command cube-api is Cube's HTTP facade: sandboxes, snapshots and commands
// over containerd. See `cube-api --help` and docs/api.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/cube-runtime/cube/checkpoint/api"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := api.Main(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}
