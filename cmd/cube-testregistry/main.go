// Command cube-testregistry is a test-host tool: it builds the container images critest pulls from a static
// busybox, serves them from an in-memory registry on 127.0.0.1 and writes containerd's hosts.toml files that
// map critest's registry names to it (integration/critest/testimages). It prints "ready <addr>" once every
// image is pushed and serves until SIGTERM. Started as nginx, httpd-foreground or pause (in the images it
// makes), it is their stand-in instead (testimages.StandIn).
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/cube-runtime/cube/integration/critest/testimages"
)

func main() {
	if testimages.IsStandIn(os.Args[0]) {
		if err := testimages.StandIn(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	busybox := flag.String("busybox", "/bin/busybox", "static busybox the images are made of")
	hostsDir := flag.String("hosts-dir", "", "write <dir>/<registry>/hosts.toml for containerd's config_path")
	verbose := flag.Bool("v", false, "log every request")
	flag.Parse()

	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "cube-testregistry: %v\n", err)
		os.Exit(1)
	}
	imgs, err := testimages.Build(*busybox, self)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cube-testregistry: build images: %v\n", err)
		os.Exit(1)
	}
	var logw *os.File
	if *verbose {
		logw = os.Stderr
	}
	s, err := testimages.Serve(*addr, imgs, logw)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cube-testregistry: %v\n", err)
		os.Exit(1)
	}
	if *hostsDir != "" {
		if err := testimages.WriteHostsDir(*hostsDir, s.Addr); err != nil {
			fmt.Fprintf(os.Stderr, "cube-testregistry: hosts.toml: %v\n", err)
			os.Exit(1)
		}
	}
	for _, im := range imgs {
		d, _ := im.Img.Digest()
		for _, r := range im.Refs {
			fmt.Printf("image %s %s\n", r, d)
		}
	}
	for r, why := range testimages.NotBuilt {
		fmt.Printf("not built %s: %s\n", r, why)
	}
	fmt.Printf("ready %s\n", s.Addr)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	s.Close()
}
