package task

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cube-runtime/cube/shim/sandbox"
)

// A checkpoint's shares are re-bound to the new container's bind mounts by
// destination (another host directory is fine); a share the new spec lacks
// is FailedPrecondition naming it and the fix; no record, no shares.
func TestRestoreSharesMatchByDestination(t *testing.T) {
	vm, newDir := t.TempDir(), t.TempDir()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if binds, guest, err := restoreShares(vm, "c2", &specs.Spec{}); err != nil || binds != nil || guest != nil {
		t.Fatalf("no record: %v %v %v", binds, guest, err)
	}
	rec := `{"shares":[{"name":"v3","host":"/old/data","read_only":false,"container":"c1","destination":"/data","ref":"hostPath volume \"data\" at /data"}]}`
	if err := os.WriteFile(filepath.Join(vm, sandbox.SharesName), []byte(rec), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := &specs.Spec{Mounts: []specs.Mount{
		{Destination: "/data", Type: "bind", Source: file, Options: []string{"rbind"}}, // a file: not a share
		{Destination: "/other", Type: "bind", Source: newDir, Options: []string{"rbind"}},
	}}
	_, _, err := restoreShares(vm, "c2", spec)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), `hostPath volume "data" at /data`) ||
		!strings.Contains(err.Error(), "dst=/data") {
		t.Fatalf("restore without a share at /data: %v, want FailedPrecondition naming it and the fix", err)
	}
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/data/", Type: "bind", Source: newDir, Options: []string{"rbind", "ro"}})
	binds, guest, err := restoreShares(vm, "c2", spec)
	if err != nil {
		t.Fatal(err)
	}
	want := sandbox.ShareRecord{Name: "v3", Host: newDir, ReadOnly: true, Container: "c2", Destination: "/data", Ref: "host directory " + newDir + " at /data"}
	if len(binds) != 1 || binds[0] != want || len(guest) != 1 || guest[0] != "/run/cube/shared/v3" {
		t.Fatalf("binds %+v guest %v, want %+v", binds, guest, want)
	}
}
