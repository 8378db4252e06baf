package control

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

type fakeSnapVM struct {
	fakeVM
	ops []string
}

func (f *fakeSnapVM) Snapshot(dir string, inc bool) (*SnapshotResult, error) {
	f.ops = append(f.ops, "snapshot "+dir)
	if inc {
		return nil, errors.New("no parent")
	}
	return &SnapshotResult{FrozenMS: 1}, nil
}

func (f *fakeSnapVM) Rollback(dir string) (*RollbackResult, error) {
	f.ops = append(f.ops, "rollback "+dir)
	return &RollbackResult{TotalMS: 2}, nil
}

func TestSnapshotOps(t *testing.T) {
	for _, target := range []Target{&fakeVM{stopped: make(chan struct{})}, &fakeSnapVM{fakeVM: fakeVM{stopped: make(chan struct{})}}} {
		path := filepath.Join(t.TempDir(), "ctl.sock")
		s, err := Listen(path, target)
		if err != nil {
			t.Fatal(err)
		}
		c, err := Dial(t.Context(), path)
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.Snapshot(t.Context(), "/s/a", false)
		sn, ok := target.(*fakeSnapVM)
		if !ok {
			if err == nil || !strings.Contains(err.Error(), "not supported") {
				t.Errorf("snapshot on a target without it: %v", err)
			}
		} else {
			if err != nil || res != (SnapshotResult{FrozenMS: 1}) {
				t.Errorf("snapshot: %+v, %v", res, err)
			}
			if _, err := c.Snapshot(t.Context(), "/s/b", true); err == nil || !strings.Contains(err.Error(), "no parent") {
				t.Errorf("incremental refusal not passed on: %v", err)
			}
			if res, err := c.Rollback(t.Context(), "/s/a"); err != nil || res != (RollbackResult{TotalMS: 2}) {
				t.Errorf("rollback: %+v, %v", res, err)
			}
			if _, err := c.Rollback(t.Context(), ""); err == nil || !strings.Contains(err.Error(), "no dir") {
				t.Errorf("rollback without dir: %v", err)
			}
			if strings.Join(sn.ops, ",") != "snapshot /s/a,snapshot /s/b,rollback /s/a" {
				t.Errorf("ops %v", sn.ops)
			}
		}
		c.Close()
		s.Close()
	}
}
