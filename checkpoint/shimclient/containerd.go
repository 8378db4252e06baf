package shimclient

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
)

// Container is what a snapshot needs to know of a container from containerd.
type Container struct {
	ID, Namespace string
	// Runtime is its runtime's name (RuntimeName for Cube's).
	Runtime string
	// Group is its sandbox group: the shim and VM it runs in.
	Group string
	// Task is its task's status ("running", "paused", …; "" when it has none).
	Task string
}

// Containers looks containers up (containerd; a fake in tests).
type Containers interface {
	Container(ctx context.Context, id string) (Container, error)
}

// Target is a Cube container and the address of its shim.
type Target struct {
	Container Container
	Address   string
}

// Resolve looks container id up and finds its shim. The errors name the
// cause and the fix: no such container, another runtime, no task, no shim
// address.
func Resolve(ctx context.Context, cs Containers, l Locator, id string) (Target, error) {
	c, err := cs.Container(ctx, id)
	if err != nil {
		return Target{}, err
	}
	if c.Runtime != RuntimeName {
		return Target{}, fmt.Errorf("container %s runs with runtime %s: only %s containers (ctr run --runtime %s) are VMs that can be snapshotted: %w",
			id, c.Runtime, RuntimeName, RuntimeName, errdefs.ErrFailedPrecondition)
	}
	if c.Task == "" {
		return Target{}, fmt.Errorf("container %s has no task: start it first (`ctr -n %s task start %s`): a snapshot is of its running VM: %w",
			id, l.Namespace, id, errdefs.ErrFailedPrecondition)
	}
	addr, err := l.Find(id, c.Group)
	if err != nil {
		return Target{}, err
	}
	return Target{Container: c, Address: addr}, nil
}

// Containerd implements Containers with containerd's client.
type Containerd struct {
	Client    *containerd.Client
	Namespace string
	Address   string // for messages
}

// ConnectTimeout bounds connecting to containerd.
const ConnectTimeout = 10 * time.Second

// Connect connects to containerd at address for namespace ns.
func Connect(ctx context.Context, address, ns string) (*Containerd, error) {
	// The client dials lazily: a missing socket would show only as the
	// first call's timeout.
	if _, err := os.Stat(socketPath(address)); err != nil {
		return nil, fmt.Errorf("containerd's socket: %w: is containerd running? (--address or CONTAINERD_ADDRESS names another socket): %w",
			err, errdefs.ErrUnavailable)
	}
	c, err := containerd.New(address, containerd.WithDefaultNamespace(ns), containerd.WithTimeout(ConnectTimeout))
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w: is containerd running there? (--address or CONTAINERD_ADDRESS names another socket): %w",
			address, err, errdefs.ErrUnavailable)
	}
	return &Containerd{Client: c, Namespace: ns, Address: address}, nil
}

// Close closes the connection to containerd.
func (c *Containerd) Close() error { return c.Client.Close() }

// Container implements Containers.
func (c *Containerd) Container(ctx context.Context, id string) (Container, error) {
	ctx = namespaces.WithNamespace(ctx, c.Namespace)
	ctr, err := c.Client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return Container{}, fmt.Errorf("no container %s in namespace %s (`ctr -n %s containers ls` lists them; --namespace or CONTAINERD_NAMESPACE picks another namespace): %w",
			id, c.Namespace, c.Namespace, errdefs.ErrNotFound)
	}
	if err != nil {
		return Container{}, fmt.Errorf("container %s: ask containerd at %s: %w (is containerd running? --address or CONTAINERD_ADDRESS names another socket)", id, c.Address, err)
	}
	info, err := ctr.Info(ctx, containerd.WithoutRefreshedMetadata)
	if err != nil {
		return Container{}, fmt.Errorf("container %s: %w", id, err)
	}
	out := Container{ID: id, Namespace: c.Namespace, Runtime: info.Runtime.Name, Group: id}
	if spec, err := ctr.Spec(ctx); err == nil && spec != nil {
		out.Group = Group(id, spec.Annotations)
	}
	task, err := ctr.Task(ctx, nil)
	switch {
	case errdefs.IsNotFound(err):
		return out, nil
	case err != nil:
		return Container{}, fmt.Errorf("container %s: its task: %w", id, err)
	}
	st, err := task.Status(ctx)
	switch {
	case errors.Is(err, errdefs.ErrNotFound): // gone meanwhile
		return out, nil
	case err != nil:
		return Container{}, fmt.Errorf("container %s: its task's status: %w", id, err)
	}
	out.Task = string(st.Status)
	if out.Task == "" {
		out.Task = "unknown"
	}
	return out, nil
}
