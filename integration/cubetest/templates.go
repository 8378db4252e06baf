package cubetest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Shim log lines (shim/sandbox, shim/template) the template tests look for
// in containerd's log, which carries the shims' logs.
const (
	LogTemplateMade = "template made"
	LogRestoring    = "restoring from template"
	LogNoTemplate   = "cold boot: no template"
)

// LogFrom is containerd's log (with the shims' lines) from byte offset from.
func (d *Daemons) LogFrom(from int64) string {
	b, _ := os.ReadFile(filepath.Join(d.Dir, "containerd.log"))
	if from > int64(len(b)) {
		return ""
	}
	return string(b[from:])
}

// GrepLines is the lines of s containing sub.
func GrepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// ColdRuntime returns the ctr run flags for io.cube.v1 with templates off
// (`templates = false`): every sandbox cold-boots.
func (d *Daemons) ColdRuntime(tb testing.TB) []string {
	conf := filepath.Join(d.Dir, "shim-cold.toml")
	body := fmt.Sprintf(ShimConfig, CubeVMM, GuestKernel, GuestInitrd, d.Dir) + "templates = false\n"
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		tb.Fatal(err)
	}
	return append([]string{"--runtime-config-path", conf}, CubeRuntime.Args...)
}
