// Package plugin registers the task service with containerd's shim plugin
// registry (imported for its side effect by cmd/containerd-shim-cube-v1).
package plugin

import (
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"
	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/shim/task"
)

func init() {
	registry.Register(&plugin.Registration{
		Type:     plugins.TTRPCPlugin,
		ID:       "task",
		Requires: []plugin.Type{plugins.EventPlugin, plugins.InternalPlugin},
		InitFn: func(ic *plugin.InitContext) (any, error) {
			pp, err := ic.GetByID(plugins.EventPlugin, "publisher")
			if err != nil {
				return nil, err
			}
			ss, err := ic.GetByID(plugins.InternalPlugin, "shutdown")
			if err != nil {
				return nil, err
			}
			ns, err := namespaces.NamespaceRequired(ic.Context)
			if err != nil {
				return nil, err
			}
			return task.New(task.Options{
				Namespace: ns,
				Publisher: pp.(shim.Publisher),
				Shutdown:  ss.(shutdown.Service),
				Log:       logrus.WithField("namespace", ns),
			}), nil
		},
	})
}
