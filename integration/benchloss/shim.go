package benchloss

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// vmmEnd matches the shim's words for how a sandbox's VMM ended, in ctr's error and in containerd's log
// (shim/sandbox exitOf: "vmm exited with status 10", "vmm killed by signal 9"; shim/task watchSandbox:
// vmm_status=10).
var vmmEnd = regexp.MustCompile(`vmm exited with status (\d+)|vmm killed by signal (\d+)|vmm_status=(\d+)`)

// Sandbox classifies err, a containerd sandbox (io.cube.v1) that failed, by evidence (ctr's output and
// containerd's log of the run): its VMM exited 10 (the guest reset) or was killed by a signal (status > 128) — the VMM gone — or the
// agent did not answer before the boot timeout — a stall — is a lost VM; anything else is a real failure
// (returned as is).
func Sandbox(evidence string, err error) error {
	if strings.Contains(evidence, "agent did not answer before the boot timeout") {
		return Stalled(err)
	}
	for _, m := range vmmEnd.FindAllStringSubmatch(evidence, -1) {
		switch {
		case m[2] != "":
			return Gone("cube-vmm killed by signal "+m[2], err)
		case m[1] != "" || m[3] != "":
			st, _ := strconv.Atoi(m[1] + m[3])
			if st == CubeVMMReset {
				return Gone(fmt.Sprintf("cube-vmm exit status %d (the guest reset)", st), err)
			}
			if st > 128 {
				return Gone(fmt.Sprintf("cube-vmm status %d (killed by signal %d)", st, st-128), err)
			}
		}
	}
	return err
}
