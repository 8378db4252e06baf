package clone

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
)

// Maker makes and removes containers (containerd; a fake in tests).
type Maker interface {
	// Record is containerd's view of container id (a fork's source).
	Record(ctx context.Context, id string) (Record, error)
	// Make creates container id as rec describes, with labels, and its task
	// restored from the VM snapshot in dir, and starts it; it returns the
	// task's pid (its VMM's). On error nothing of it remains.
	Make(ctx context.Context, id string, rec Record, dir string, labels map[string]string) (uint32, error)
	// Remove kills and deletes container id's task, then the container and
	// its rootfs snapshot.
	Remove(ctx context.Context, id string) error
}

// Containerd implements Maker with containerd's client.
type Containerd struct {
	Client    *containerd.Client
	Namespace string
}

// Record implements Maker.
func (c *Containerd) Record(ctx context.Context, id string) (Record, error) {
	ctx = namespaces.WithNamespace(ctx, c.Namespace)
	ctr, err := c.Client.LoadContainer(ctx, id)
	if err != nil {
		return Record{}, fmt.Errorf("container %s in namespace %s: %w", id, c.Namespace, err)
	}
	info, err := ctr.Info(ctx, containerd.WithoutRefreshedMetadata)
	if err != nil {
		return Record{}, fmt.Errorf("container %s: %w", id, err)
	}
	spec, err := ctr.Spec(ctx)
	if err != nil {
		return Record{}, fmt.Errorf("container %s: its spec: %w", id, err)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return Record{}, err
	}
	if info.Image == "" || info.Snapshotter == "" {
		return Record{}, fmt.Errorf("container %s has no image or snapshotter recorded (made without `ctr run IMAGE`?): its clones' rootfs cannot be made: %w", id, errdefs.ErrFailedPrecondition)
	}
	return Record{Version: RecordVersion, Container: id, Namespace: c.Namespace, Image: info.Image,
		Snapshotter: info.Snapshotter, Runtime: info.Runtime.Name, Spec: b}, nil
}

// cloneSpec is rec's spec for container id: what names the source
// container in it (its cgroup path, a pod's sandbox annotations) is the new
// container's.
func cloneSpec(rec Record, ns, id string) (*oci.Spec, error) {
	var spec oci.Spec
	if err := json.Unmarshal(rec.Spec, &spec); err != nil {
		return nil, fmt.Errorf("container record: spec: %v: %w", err, errdefs.ErrDataLoss)
	}
	if spec.Linux != nil && spec.Linux.CgroupsPath != "" {
		if old := "/" + rec.Namespace + "/" + rec.Container; spec.Linux.CgroupsPath == old {
			spec.Linux.CgroupsPath = "/" + ns + "/" + id
		} else {
			spec.Linux.CgroupsPath = "" // another layout (a pod's): the shim's cgroup_parent decides
		}
	}
	for k := range spec.Annotations {
		if strings.HasPrefix(k, "io.kubernetes.cri.") {
			delete(spec.Annotations, k)
		}
	}
	return &spec, nil
}

// Make implements Maker: runc's task-create option CriuImagePath is how
// containerd passes a restore directory to a shim without copying it.
func (c *Containerd) Make(ctx context.Context, id string, rec Record, dir string, labels map[string]string) (_ uint32, retErr error) {
	ctx = namespaces.WithNamespace(ctx, c.Namespace)
	image, err := c.Client.GetImage(ctx, rec.Image)
	if err != nil {
		return 0, fmt.Errorf("clone %s: image %s: %w (it must be in namespace %s, unpacked for snapshotter %s: ctr images import/pull --snapshotter %s)",
			id, rec.Image, err, c.Namespace, rec.Snapshotter, rec.Snapshotter)
	}
	spec, err := cloneSpec(rec, c.Namespace, id)
	if err != nil {
		return 0, err
	}
	ctr, err := c.Client.NewContainer(ctx, id, containerd.WithImage(image), containerd.WithSnapshotter(rec.Snapshotter),
		containerd.WithNewSnapshot(id, image), containerd.WithRuntime(rec.Runtime, nil), containerd.WithSpec(spec),
		containerd.WithContainerLabels(labels))
	if err != nil {
		return 0, fmt.Errorf("clone %s: create the container: %w", id, err)
	}
	defer func() {
		if retErr != nil {
			dctx := context.WithoutCancel(ctx)
			if err := ctr.Delete(dctx, containerd.WithSnapshotCleanup); err != nil {
				retErr = errors.Join(retErr, fmt.Errorf("and removing container %s failed: %w", id, err))
			}
		}
	}()
	task, err := ctr.NewTask(ctx, cio.NullIO, containerd.WithRestoreImagePath(dir))
	if err != nil {
		return 0, fmt.Errorf("clone %s: restore its task from %s: %w", id, dir, err)
	}
	if err := task.Start(ctx); err != nil {
		if _, derr := task.Delete(context.WithoutCancel(ctx), containerd.WithProcessKill); derr != nil {
			err = errors.Join(err, fmt.Errorf("and deleting its task failed: %w", derr))
		}
		return 0, fmt.Errorf("clone %s: start its restored task: %w", id, err)
	}
	return task.Pid(), nil
}

// Remove implements Maker.
func (c *Containerd) Remove(ctx context.Context, id string) error {
	ctx = namespaces.WithNamespace(ctx, c.Namespace)
	ctr, err := c.Client.LoadContainer(ctx, id)
	if err != nil {
		return fmt.Errorf("remove %s: %w", id, err)
	}
	task, err := ctr.Task(ctx, nil)
	switch {
	case err == nil:
		if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("remove %s: its task: %w", id, err)
		}
	case !errdefs.IsNotFound(err):
		return fmt.Errorf("remove %s: its task: %w", id, err)
	}
	if err := ctr.Delete(ctx, containerd.WithSnapshotCleanup); err != nil {
		return fmt.Errorf("remove %s: %w", id, err)
	}
	return nil
}

var (
	_ Finisher = (*Containerd)(nil)
	_ Lister   = (*Containerd)(nil)
)

// DropLabel implements Finisher.
func (c *Containerd) DropLabel(ctx context.Context, id, label string) error {
	ctx = namespaces.WithNamespace(ctx, c.Namespace)
	ctr, err := c.Client.LoadContainer(ctx, id)
	if err != nil {
		return fmt.Errorf("container %s: %w", id, err)
	}
	if _, err := ctr.SetLabels(ctx, map[string]string{label: ""}); err != nil {
		return fmt.Errorf("container %s: drop label %s: %w", id, label, err)
	}
	return nil
}

// Labelled implements Lister.
func (c *Containerd) Labelled(ctx context.Context, label string) (map[string]string, error) {
	ctx = namespaces.WithNamespace(ctx, c.Namespace)
	cs, err := c.Client.Containers(ctx, fmt.Sprintf("labels.%q", label))
	if err != nil {
		return nil, fmt.Errorf("containers labelled %s in namespace %s: %w", label, c.Namespace, err)
	}
	out := map[string]string{}
	for _, ctr := range cs {
		labels, err := ctr.Labels(ctx)
		if err != nil {
			if errdefs.IsNotFound(err) {
				continue
			}
			return nil, err
		}
		if v, ok := labels[label]; ok && v != "" {
			out[ctr.ID()] = v
		}
	}
	return out, nil
}
