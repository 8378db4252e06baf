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
	// LogAdopted is the shim's line when a sandbox takes a standby VM.
	LogAdopted = "adopted a standby VM"
	// LogStandbyStarted is the shim's line when it leaves one for the next sandbox.
	LogStandbyStarted = "standby VM started for the next sandbox"
	LogNoTemplate     = "cold boot: no template"
)

// LogFrom is containerd's log (with the shims' lines) from byte offset from.
func (d *Daemons) LogFrom(from int64) string { return logFrom(d.Dir, from) }

// LogFrom is the CRI containerd's log (with the shims' lines) from byte
// offset from.
func (c *CRI) LogFrom(from int64) string { return logFrom(c.Dir, from) }

// LogSize is where the CRI containerd's log ends now.
func (c *CRI) LogSize() int64 { return logSize(c.Dir) }

// logFrom is the containerd log in dir from byte offset from.
func logFrom(dir string, from int64) string {
	b, _ := os.ReadFile(filepath.Join(dir, "containerd.log"))
	if from > int64(len(b)) {
		return ""
	}
	return string(b[from:])
}

// logSize is where the containerd log in dir ends now (0 if there is none).
func logSize(dir string) int64 {
	fi, err := os.Stat(filepath.Join(dir, "containerd.log"))
	if err != nil {
		return 0
	}
	return fi.Size()
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
