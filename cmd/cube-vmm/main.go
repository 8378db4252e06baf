// Command cube-vmm runs one microVM. See `cube-vmm --help` and docs/vmm.md.
package main

import (
	"os"

	"github.com/cube-runtime/cube/hypervisor/vmmcmd"
)

func main() {
	vmmcmd.DisableHeapTHP() // may re-execute this program
	os.Exit(vmmcmd.Run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
