// Package plugin registers the shim's snapshot service (cube.snapshot.v1)
// with containerd's shim plugin registry, as a TTRPC plugin: pkg/shim
// registers every TTRPC plugin on the shim's one ttrpc server, so the service
// shares the task API's socket (imported for its side effect by
// cmd/containerd-shim-cube-v1).
package plugin

import (
	"context"
	"fmt"
	"sync"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/errdefs"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"
	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/snapshotsvc"
)

// ID is the plugin's id (io.containerd.ttrpc.v1.cube-snapshot).
const ID = "cube-snapshot"

// TaskID is the task service's plugin id (shim/task/plugin), whose
// containers and VM the snapshot service works on.
const TaskID = "task"

func init() {
	registry.Register(&plugin.Registration{
		Type: plugins.TTRPCPlugin,
		ID:   ID,
		// A plugin cannot require its own type, so nothing orders the task
		// service (a TTRPC plugin too) before this one: it is looked up at
		// the first request (lateTask), when every plugin is initialized
		// (pkg/shim serves only after that).
		InitFn: func(ic *plugin.InitContext) (any, error) {
			ns, err := namespaces.NamespaceRequired(ic.Context)
			if err != nil {
				return nil, err
			}
			return snapshotsvc.New(snapshotsvc.Options{
				Namespace: ns,
				Sandboxes: &lateTask{get: func() (any, error) { return ic.GetByID(plugins.TTRPCPlugin, TaskID) }},
				Log:       logrus.WithFields(logrus.Fields{"namespace": ns, "service": "snapshot"}),
			}), nil
		},
	})
}

// lateTask finds the task service the first time it is needed.
type lateTask struct {
	get func() (any, error)

	mu   sync.Mutex
	task snapshotsvc.Sandboxes
}

// SandboxOf implements snapshotsvc.Sandboxes.
func (l *lateTask) SandboxOf(id string) (*sandbox.Sandbox, error) {
	t, err := l.resolve()
	if err != nil {
		return nil, err
	}
	return t.SandboxOf(id)
}

func (l *lateTask) resolve() (snapshotsvc.Sandboxes, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.task != nil {
		return l.task, nil
	}
	t, err := l.get()
	if err != nil {
		return nil, fmt.Errorf("the shim's task service (plugin %s) is not loaded: %v: %w", TaskID, err, errdefs.ErrUnavailable)
	}
	sbs, ok := t.(snapshotsvc.Sandboxes)
	if !ok {
		return nil, fmt.Errorf("the shim's task service %T cannot say which VM runs a container: %w", t, errdefs.ErrInternal)
	}
	l.task = sbs
	return sbs, nil
}

// RollbackSandbox implements snapshotsvc.Processes.
func (l *lateTask) RollbackSandbox(ctx context.Context, containerID, dir, what string) (sandbox.RollbackStats, error) {
	p, err := l.processes()
	if err != nil {
		return sandbox.RollbackStats{}, err
	}
	return p.RollbackSandbox(ctx, containerID, dir, what)
}

// GuestProcesses implements snapshotsvc.Processes.
func (l *lateTask) GuestProcesses(ctx context.Context, containerID string) ([]sandbox.GuestProcess, error) {
	p, err := l.processes()
	if err != nil {
		return nil, err
	}
	return p.GuestProcesses(ctx, containerID)
}

// SignalGuest implements snapshotsvc.Processes.
func (l *lateTask) SignalGuest(ctx context.Context, containerID, execID string, sig uint32, all bool) error {
	p, err := l.processes()
	if err != nil {
		return err
	}
	return p.SignalGuest(ctx, containerID, execID, sig, all)
}

func (l *lateTask) processes() (snapshotsvc.Processes, error) {
	t, err := l.resolve()
	if err != nil {
		return nil, err
	}
	p, ok := t.(snapshotsvc.Processes)
	if !ok {
		return nil, fmt.Errorf("the shim's task service %T cannot reconcile processes: %w", t, errdefs.ErrNotImplemented)
	}
	return p, nil
}
