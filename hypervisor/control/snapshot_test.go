package control

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

type fakeSnapVM struct {
	fakeVM
	ops []string
}

func (f *fakeSnapVM) Snapshot(dir string, inc bool) (json.RawMessage, error) {
	f.ops = append(f.ops, "snapshot "+dir)
	if inc {
		return nil, errors.New("no parent")
	}
	return json.RawMessage(`{"frozen_ms":1}`), nil
}

func (f *fakeSnapVM) Rollback(dir string) (json.RawMessage, error) {
	f.ops = append(f.ops, "rollback "+dir)
	return json.RawMessage(`{"total_ms":2}`), nil
}

func TestSnapshotOps(t *testing.T) {
	for _, target := range []Target{&fakeVM{stopped: make(chan struct{})}, &fakeSnapVM{fakeVM: fakeVM{stopped: make(chan struct{})}}} {
		path := filepath.Join(t.TempDir(), "ctl.sock")
		s, err := Listen(path, target)
		if err != nil {
			t.Fatal(err)
		}
		c, err := Dial(path)
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.Snapshot("/s/a", false)
		sn, ok := target.(*fakeSnapVM)
		if !ok {
			if err == nil || !strings.Contains(err.Error(), "not supported") {
				t.Errorf("snapshot on a target without it: %v", err)
			}
		} else {
			if err != nil || string(res) != `{"frozen_ms":1}` {
				t.Errorf("snapshot: %s, %v", res, err)
			}
			if _, err := c.Snapshot("/s/b", true); err == nil || !strings.Contains(err.Error(), "no parent") {
				t.Errorf("incremental refusal not passed on: %v", err)
			}
			if res, err := c.Rollback("/s/a"); err != nil || string(res) != `{"total_ms":2}` {
				t.Errorf("rollback: %s, %v", res, err)
			}
			if _, err := c.DoRequest(Request{Op: "rollback"}); err == nil || !strings.Contains(err.Error(), "no dir") {
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
