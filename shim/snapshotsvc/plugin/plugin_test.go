package plugin

import (
	"errors"
	"testing"

	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/errdefs"
	"github.com/containerd/plugin/registry"

	"github.com/cube-runtime/cube/shim/sandbox"
)

func TestRegisteredAsTTRPCPlugin(t *testing.T) {
	for _, r := range registry.Graph(nil) {
		if r.ID == ID {
			if r.Type != plugins.TTRPCPlugin {
				t.Fatalf("registered as %s, want %s (pkg/shim serves TTRPC plugins on the shim's socket)", r.Type, plugins.TTRPCPlugin)
			}
			return
		}
	}
	t.Fatalf("no plugin %s registered", ID)
}

type fakeTask struct{ asked []string }

func (f *fakeTask) SandboxOf(id string) (*sandbox.Sandbox, error) {
	f.asked = append(f.asked, id)
	return nil, errors.New("fake")
}

func TestLateTask(t *testing.T) {
	var task any
	l := &lateTask{get: func() (any, error) {
		if task == nil {
			return nil, errors.New("no plugins registered for io.containerd.ttrpc.v1.task")
		}
		return task, nil
	}}
	if _, err := l.SandboxOf("c1"); !errdefs.IsUnavailable(err) {
		t.Fatalf("before the task service is loaded: %v", err)
	}
	task = struct{}{}
	if _, err := l.SandboxOf("c1"); !errdefs.IsInternal(err) {
		t.Fatalf("a task service of the wrong type: %v", err)
	}
	f := &fakeTask{}
	task = f
	l.SandboxOf("c1")
	task = nil // found once, kept
	l.SandboxOf("c2")
	if len(f.asked) != 2 || f.asked[1] != "c2" {
		t.Fatalf("task service asked %v", f.asked)
	}
}
