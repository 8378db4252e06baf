// Command cube-guestimage builds the sandbox guest image: the pinned Debian cloud kernel and an initramfs
// whose /init is the guest agent, with the kernel modules the agent loads.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/cube-runtime/cube/contrib/guestimage"
	"github.com/cube-runtime/cube/guest-agent/initsys"
)

func main() {
	agent := flag.String("agent", "bin/cube-agent", "static guest agent binary (make agent)")
	out := flag.String("out", "bin/guest", "output directory for vmlinuz and initramfs.cpio.gz")
	cache := flag.String("cache", guestimage.DefaultCacheDir(), "cache directory for the kernel package")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: cube-guestimage [flags]\n\nBuilds the guest image (kernel %s %s + agent initramfs).\n\n", guestimage.KernelPackage, guestimage.KernelVersion)
		flag.PrintDefaults()
	}
	flag.Parse()
	g, err := guestimage.BuildGuest(context.Background(), *cache, *out, guestimage.GuestSpec{Init: *agent, Modules: initsys.ModuleNames()})
	if err != nil {
		fmt.Fprintf(os.Stderr, "cube-guestimage: %v\n", err)
		os.Exit(1)
	}
	st, _ := os.Stat(g.Initramfs)
	fmt.Printf("guest image: kernel %s (%s), initramfs %s (%d bytes, %d modules)\n", g.Kernel, g.Release, g.Initramfs, st.Size(), len(g.Modules))
}
