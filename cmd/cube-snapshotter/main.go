// Command cube-snapshotter serves Cube's ext4-image snapshotter to containerd
// as a proxy snapshot plugin. See docs/snapshotter.md.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/snapshotter/imagefile"
	"github.com/cube-runtime/cube/snapshotter/service"
)

const usage = `Usage:
  cube-snapshotter [--config FILE] [--root DIR] [--address SOCK] [--log-level LEVEL]
      serve containerd's snapshot API (proxy plugin) until SIGINT/SIGTERM
  cube-snapshotter status [--config FILE] [--root DIR]
      print the running snapshotter's status (mode reflink|copy, socket, pid)
  cube-snapshotter probe DIR
      report whether DIR's filesystem can reflink
  cube-snapshotter default-config
      print the default configuration (TOML)

Flags override the configuration file. Default config file: /etc/cube/snapshotter.toml
(used only if it exists).

`

const defaultConfigPath = "/etc/cube/snapshotter.toml"

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "cube-snapshotter:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	cmd := "serve"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "default-config":
		fmt.Print(service.DefaultTOML)
		return nil
	case "probe":
		if len(args) != 1 {
			return fmt.Errorf("probe: want one directory")
		}
		ok, err := imagefile.ProbeReflink(args[0])
		if err != nil {
			return err
		}
		mode := imagefile.ModeCopy
		if ok {
			mode = imagefile.ModeReflink
		}
		fmt.Println(mode)
		return nil
	case "serve", "status":
	case "help":
		fmt.Print(usage)
		return nil
	default:
		return fmt.Errorf("unknown command %q (try --help)", cmd)
	}

	fs := flag.NewFlagSet("cube-snapshotter", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage, "Flags:\n"); fs.PrintDefaults() }
	cfgPath := fs.String("config", "", "TOML configuration file (default "+defaultConfigPath+" if present)")
	root := fs.String("root", "", "root directory for metadata and images (default "+service.DefaultRoot+")")
	address := fs.String("address", "", "Unix socket to serve on (default "+service.DefaultAddress+")")
	level := fs.String("log-level", "", "log level: debug, info, warn, error (default info)")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg := service.DefaultConfig()
	path := *cfgPath
	if path == "" {
		if _, err := os.Stat(defaultConfigPath); err == nil {
			path = defaultConfigPath
		}
	}
	if path != "" {
		var err error
		if cfg, err = service.LoadConfig(path); err != nil {
			return err
		}
	}
	if *root != "" {
		cfg.Root = *root
	}
	if *address != "" {
		cfg.Address = *address
	}
	if *level != "" {
		cfg.LogLevel = *level
	}

	if cmd == "status" {
		st, err := service.ReadStatus(cfg.Root)
		if err != nil {
			return err
		}
		out, _ := json.MarshalIndent(st, "", "  ")
		fmt.Println(string(out))
		return nil
	}

	lvl, err := logrus.ParseLevel(cfg.LogLevel)
	if err != nil {
		return fmt.Errorf("log level: %w", err)
	}
	logger := logrus.New()
	logger.SetLevel(lvl)
	logger.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	log := logrus.NewEntry(logger)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	svc, err := service.Start(ctx, cfg, log)
	if err != nil {
		return err
	}
	return svc.Serve(ctx)
}
