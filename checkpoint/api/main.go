package api

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/sirupsen/logrus"
)

const mainHelp = `Usage: cube-api [--config FILE] [--listen HOST:PORT]

cube-api serves Cube's HTTP API (E2B/CubeSandbox-compatible routes): sandboxes
as io.cube.v1 containers of containerd, their snapshots in Cube's snapshot
store, and commands in them. GET /openapi.json lists the routes; docs/api.md
documents them, the config file and its defaults.

Flags:
  --config FILE      TOML config (default /etc/cube/api.toml; a missing default file means the defaults)
  --listen HOST:PORT overrides the config's listen (default 127.0.0.1:3000)

Beyond loopback cube-api needs an API key (api_keys or api_keys_file).
SIGINT or SIGTERM shut it down gracefully.
`

// Main is cube-api's main with args (without the program name): 0 after a
// clean shutdown, 1 on failure, 2 on bad usage.
func Main(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("cube-api", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	config := fs.String("config", "", "config file")
	listen := fs.String("listen", "", "listen address")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, mainHelp)
			return 0
		}
		fmt.Fprintf(stderr, "cube-api: %v\n\n%s", err, mainHelp)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "cube-api: unexpected arguments %q\n\n%s", fs.Args(), mainHelp)
		return 2
	}
	cfg, err := LoadConfig(*config)
	if err == nil && *listen != "" {
		cfg.Listen = *listen
		err = cfg.Validate()
	}
	if err != nil {
		fmt.Fprintf(stderr, "cube-api: %v\n", err)
		return 1
	}
	log := logrus.New()
	log.SetOutput(stderr)
	if lvl, err := logrus.ParseLevel(cfg.LogLevel); err == nil {
		log.SetLevel(lvl)
	}
	if err := Run(ctx, cfg, log, nil); err != nil {
		log.WithError(err).Error("cube-api")
		return 1
	}
	return 0
}
