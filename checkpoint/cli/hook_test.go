package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestOCIHookUsage(t *testing.T) {
	for _, args := range [][]string{{"internal", "--help"}, {"help", "internal"}, {"internal", "oci-hook", "--help"}} {
		code, out, _ := run(t, Env{}, args...)
		if code != ExitOK || !strings.Contains(out, "Usage: cube internal oci-hook") || !strings.Contains(out, "io.cube.network.ports") {
			t.Errorf("%v: %d %q", args, code, out)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"internal"}, "oci-hook PHASE"},
		{[]string{"internal", "oci-hook"}, "want one PHASE"},
		{[]string{"internal", "oci-hook", "start"}, `phase "start"`},
		{[]string{"internal", "oci-hook", "--bogus", "poststop"}, "bogus"},
	} {
		e := Env{Stdin: strings.NewReader(`{"id":"x","pid":1}`)}
		code, _, errOut := run(t, e, c.args...)
		if code != ExitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: %d %q, want usage error with %q", c.args, code, errOut, c.want)
		}
	}
}

func TestOCIHookFailures(t *testing.T) {
	dir := t.TempDir()
	flags := []string{"internal", "oci-hook", "--cni-conf-dir", filepath.Join(dir, "conf"), "--cni-bin-dir", filepath.Join(dir, "bin"),
		"--cni-cache-dir", filepath.Join(dir, "cache")}
	hook := func(stdin string, phase string, extra ...string) (int, string) {
		code, _, errOut := run(t, Env{Stdin: strings.NewReader(stdin)}, append(append(append([]string{}, flags...), extra...), phase)...)
		return code, errOut
	}
	if code, errOut := hook("{", "createRuntime"); code != ExitFailure || !strings.Contains(errOut, "OCI state") {
		t.Errorf("bad state: %d %q", code, errOut)
	}
	if code, errOut := hook(`{"id":"x"}`, "createRuntime"); code != ExitFailure || !strings.Contains(errOut, "no pid") {
		t.Errorf("no pid: %d %q", code, errOut)
	}
	// The default list was written by the first ADD attempt.
	if _, err := os.Stat(filepath.Join(dir, "conf", "cube.conflist")); err != nil {
		t.Errorf("default list: %v", err)
	}
	if code, errOut := hook(`{"id":"x","pid":1}`, "createRuntime", "--network", "corp"); code != ExitFailure || !strings.Contains(errOut, "corp.conflist") {
		t.Errorf("unknown network: %d %q", code, errOut)
	}
	// No plugins: ADD fails naming the plugin.
	if code, errOut := hook(`{"id":"x","pid":1}`, "createRuntime"); code != ExitFailure || !strings.Contains(errOut, "CNI ADD") {
		t.Errorf("no plugins: %d %q", code, errOut)
	}
}
