package api

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// envE2BSDK names a directory whose node_modules holds E2B's `e2b` npm
// package (contrib/scripts/e2e-e2b.sh installs it in ~/.cache/cube/e2b-npm).
const envE2BSDK = "CUBE_E2B_SDK_DIR"

// TestE2BSDKAgainstFake runs contrib/sdk/e2b-compat/e2e.mjs, E2B's own
// JavaScript SDK unmodified, against the handlers over the fake backend:
// its REST calls, its Connect RPCs (JSON, server streaming) and its HTTP
// file routes. It needs node and the package (CUBE_E2B_SDK_DIR, else
// ~/.cache/cube/e2b-npm when make e2e-e2b installed it there); without them
// it skips. The fake's restored sandboxes do not carry files (they do
// end to end: make e2e-e2b).
func TestE2BSDKAgainstFake(t *testing.T) {
	dir := os.Getenv(envE2BSDK)
	if home, err := os.UserHomeDir(); dir == "" && err == nil {
		// Where make e2e-e2b installs it.
		if _, err := os.Stat(filepath.Join(home, ".cache/cube/e2b-npm/node_modules/e2b/package.json")); err == nil {
			dir = filepath.Join(home, ".cache/cube/e2b-npm")
		}
	}
	node, err := exec.LookPath("node")
	if dir == "" || err != nil {
		t.Skipf("needs node and %s (a directory with node_modules/e2b: npm install e2b there; make e2e-e2b installs it in ~/.cache/cube/e2b-npm)", envE2BSDK)
	}
	e := newEnv(t, func(c *Config) { c.MaxBodyBytes = 1 << 20 }, "e2b-fake-key-0123456789")
	e.f.images["docker.io/cube/e2e:latest"] = true
	work := t.TempDir()
	script, _ := filepath.Abs("../../contrib/sdk/e2b-compat/e2e.mjs")
	src, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	// ESM resolves `e2b` from the script's directory up.
	if err := os.WriteFile(filepath.Join(work, "e2e.mjs"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "node_modules"), filepath.Join(work, "node_modules")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "e2e.mjs", "--no-restored-files")
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "E2B_API_URL="+e.srv.URL, "E2B_SANDBOX_URL="+e.srv.URL, "E2B_API_KEY="+e.key)
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("the e2b SDK's story failed: %v\nserver log:\n%s", err, e.logs.String())
	}
	if left, _ := e.f.List(ctx); len(left) > 0 {
		t.Errorf("%d sandboxes left", len(left))
	}
}

// fakeLine runs a command line of built-in programs (echo, exit N, cat
// FILE, sleep), "; "-separated, each to stderr with ">&2"; its exit code.
func (f *fakeBackend) fakeLine(id, line string, eio ExecIO, p *fakeProc) int {
	for _, cmd := range strings.Split(line, "; ") {
		out := eio.Stdout
		if c, ok := strings.CutSuffix(cmd, " >&2"); ok {
			cmd, out = c, eio.Stderr
		}
		w := strings.Fields(cmd)
		if len(w) == 0 {
			continue
		}
		switch w[0] {
		case "echo":
			fmt.Fprintln(out, strings.Join(w[1:], " "))
		case "exit":
			code := 0
			if len(w) > 1 {
				code, _ = strconv.Atoi(w[1])
			}
			return code
		case "cat":
			if len(w) > 1 {
				if ch, err := f.ReadFile(context.Background(), id, w[1], 0, MaxFileChunk); err == nil {
					_, _ = out.Write(ch.Data)
				}
			}
		case "sleep":
			select {
			case sig := <-p.killC:
				return 128 + int(sig)
			case <-p.ended:
				return 137
			}
		default:
			fmt.Fprintf(eio.Stderr, "%s: not found\n", w[0])
			return 127
		}
	}
	return 0
}
