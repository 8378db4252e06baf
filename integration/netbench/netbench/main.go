// Command netbench is the serving end of the net benchmark (integration/netbench): a static binary run as the
// guest's workload under cube-vmm and QEMU, and as a runc container's process.
//
//	netbench [-listen ADDR]   serve until a client sends QUIT (exit 0)
package main

import (
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"

	"github.com/cube-runtime/cube/integration/netbench"
)

func main() {
	addr := flag.String("listen", fmt.Sprintf(":%d", netbench.Port), "TCP address to serve on")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatalf("netbench: %v", err)
	}
	fmt.Printf("NETBENCH_LISTENING=%s\n", ln.Addr())
	if err := netbench.Serve(ln, log.Printf); !errors.Is(err, netbench.ErrQuit) {
		log.Fatalf("netbench: %v", err)
	}
	os.Exit(0)
}
