// Package plugin registers the shim's files service (cube.files.v1) with
// containerd's shim plugin registry as a TTRPC plugin, so that it shares
// the task API's socket (imported for its side effect by
// cmd/containerd-shim-cube-v1).
package plugin

import (
	"fmt"
	"sync"

	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/errdefs"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"

	"github.com/cube-runtime/cube/shim/filessvc"
	"github.com/cube-runtime/cube/shim/sandbox"
)

// ID is the plugin's id (io.containerd.ttrpc.v1.cube-files).
const ID = "cube-files"

// TaskID is the task service's plugin id (shim/task/plugin).
const TaskID = "task"

func init() {
	registry.Register(&plugin.Registration{
		Type: plugins.TTRPCPlugin,
		ID:   ID,
		// The task service is a TTRPC plugin too, which a plugin cannot
		// require: it is looked up at the first request (pkg/shim serves
		// only once every plugin is initialized).
		InitFn: func(ic *plugin.InitContext) (any, error) {
			return filessvc.New(&lateTask{get: func() (any, error) { return ic.GetByID(plugins.TTRPCPlugin, TaskID) }}), nil
		},
	})
}

// lateTask finds the task service the first time it is needed.
type lateTask struct {
	get func() (any, error)

	mu   sync.Mutex
	task filessvc.Sandboxes
}

// SandboxOf implements filessvc.Sandboxes.
func (l *lateTask) SandboxOf(id string) (*sandbox.Sandbox, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.task == nil {
		t, err := l.get()
		if err != nil {
			return nil, fmt.Errorf("the shim's task service (plugin %s) is not loaded: %v: %w", TaskID, err, errdefs.ErrUnavailable)
		}
		sbs, ok := t.(filessvc.Sandboxes)
		if !ok {
			return nil, fmt.Errorf("the shim's task service %T cannot say which VM runs a container: %w", t, errdefs.ErrInternal)
		}
		l.task = sbs
	}
	return l.task.SandboxOf(id)
}
