package cubetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/checkpoint/cli"
	"github.com/cube-runtime/cube/checkpoint/store"
)

// CubeBin is the cube CLI in the test host (TestMain builds it).
const CubeBin = "/cube/bin/cube"

// StoreRoot is the snapshot store of d's containerd: beside the snapshotter's
// root, as store.DefaultRoot is beside the default one.
func (d *Daemons) StoreRoot() string { return store.RootBeside(d.Dir + "/snaproot") }

// Cube runs the Cube CLI against d's containerd (its address, namespace and
// state directory) and store, and returns its stdout and stderr together; a
// non-zero exit is rc, not an error.
func (d *Daemons) Cube(t testing.TB, args ...string) (string, int) {
	t.Helper()
	out, errOut, rc := d.CubeRun(t, args...)
	return out + errOut, rc
}

// CubeRun is cube with stdout and stderr apart.
func (d *Daemons) CubeRun(t testing.TB, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	all := append([]string{"--address", d.Dir + "/containerd.sock", "--namespace", "e2e", "--state", d.Dir + "/state",
		"--store-root", d.StoreRoot()}, args...)
	cmd := exec.CommandContext(ctx, CubeBin, all...)
	var stdout, stderr bytes.Buffer
	cmd.Env, cmd.Stdout, cmd.Stderr = d.Env, &stdout, &stderr
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	var ee *exec.ExitError
	rc := 0
	switch {
	case errors.As(err, &ee):
		rc = ee.ExitCode()
	case err != nil:
		t.Fatalf("cube %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	t.Logf("cube %s: rc %d\n%s%s", strings.Join(args, " "), rc, stdout.String(), stderr.String())
	return stdout.String(), stderr.String(), rc
}

// CubeJSON runs a cube command that prints a snapshot as JSON.
func (d *Daemons) CubeJSON(t testing.TB, args ...string) cli.Description {
	t.Helper()
	out, _, rc := d.CubeRun(t, args...)
	var desc cli.Description
	if rc != 0 {
		t.Fatalf("cube %s: rc %d", strings.Join(args, " "), rc)
	}
	if err := json.Unmarshal([]byte(out), &desc); err != nil {
		t.Fatalf("cube %s: not a snapshot as JSON: %v", strings.Join(args, " "), err)
	}
	return desc
}

// CounterAbove waits until container id's counter (CounterScript) passes n.
func (d *Daemons) CounterAbove(t testing.TB, id string, n int) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if c := d.ReadCounter(t, id); c > n {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the counter stays at %d: the container does not run on", id, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
