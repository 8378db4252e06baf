// Package python runs the Python SDK's unit tests (contrib/sdk/python,
// standard library only) as part of `go test ./...`, so `make test-unit` and
// `make test-full` run them. They skip when python3 is not installed.
package python

import (
	"context"
	"os/exec"
	"testing"
	"time"
)

func TestPythonSDK(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed: the Python SDK's tests (python3 -m unittest discover -s tests -t . in contrib/sdk/python) did not run")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-B", "-m", "unittest", "discover", "-s", "tests", "-t", ".")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 -m unittest: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
