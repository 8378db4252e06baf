package cubetest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cube-runtime/cube/integration/benchloss"
)

// Through containerd a lost nested VM (README "Known problems") shows as a failed `ctr run` or a task that
// stopped, with the sandbox's VMM gone; benchloss.Sandbox reads the shim's words for it in ctr's output and in
// containerd's log. The sandbox's console log goes with its state directory, so that is the evidence there is.

// LogSize is where containerd's log ends now: the start of what a run adds to it.
func (d *Daemons) LogSize() int64 { return logSize(d.Dir) }

// VMMLog is what containerd's log got since from about sandbox VMs: the shim's lines about its VMM and the
// VMM's own (its stderr, with the console tail of a panic).
func (d *Daemons) VMMLog(from int64) string {
	f, err := os.Open(filepath.Join(d.Dir, "containerd.log"))
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	f.Seek(from, 0)
	var b strings.Builder
	buf := make([]byte, 1<<20)
	n, _ := f.Read(buf)
	for _, l := range strings.Split(string(buf[:n]), "\n") {
		if strings.Contains(l, "vmm") || strings.Contains(l, "sandbox") || strings.Contains(l, "agent") {
			b.WriteString(l + "\n")
		}
	}
	// Enough for the shim's guest console tail (40 lines) and cube-vmm's own report of a reset or panic.
	return LastLines(b.String(), 120)
}

// CtrFailure is the error of a benchmark's failed `ctr args` (rc, its output out, containerd's log since
// from), classified: ctr killed at its timeout (rc -1) is a stall, and benchloss.Sandbox reads the rest.
func (d *Daemons) CtrFailure(args []string, out string, rc int, err error, from int64) error {
	log := d.VMMLog(from)
	ferr := fmt.Errorf("ctr %s: rc %d %v\n%s\ncontainerd log of the run (sandbox lines):\n%s", strings.Join(args, " "), rc, err,
		LastLines(strings.TrimSpace(out), 20), log)
	switch {
	case err != nil: // ctr did not run
		return ferr
	case rc == -1:
		return benchloss.Stalled(ferr)
	}
	return benchloss.Sandbox(out+"\n"+log, ferr)
}

// Forget removes what is left of a benchmark's sandbox id after a failure.
func (d *Daemons) Forget(id string) {
	d.CtrQuiet(nil, "task", "rm", "-f", id)
	d.CtrQuiet(nil, "container", "rm", id)
}
