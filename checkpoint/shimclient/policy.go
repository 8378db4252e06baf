package shimclient

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	api "github.com/cube-runtime/cube/shim/snapshotapi"
)

// The spec annotations the shim reads a sandbox's first egress policy from
// (shim/podnet's io.cube.network.*; a test keeps them equal).
const (
	AnnotationAllowInternet = "io.cube.network.allow-internet-access"
	AnnotationAllowOut      = "io.cube.network.allow-out"
	AnnotationDenyOut       = "io.cube.network.deny-out"
)

// PolicyAnnotations is p as those annotations (nil p: everything allowed).
func PolicyAnnotations(p *api.NetworkPolicy) map[string]string {
	allow := p == nil || p.AllowInternetAccess == nil || *p.AllowInternetAccess
	a := map[string]string{AnnotationAllowInternet: strconv.FormatBool(allow), AnnotationAllowOut: "", AnnotationDenyOut: ""}
	if p != nil {
		a[AnnotationAllowOut] = strings.Join(p.AllowOut, ",")
		a[AnnotationDenyOut] = strings.Join(p.DenyOut, ",")
	}
	return a
}

// PolicyRecorder keeps a sandbox's current egress policy in its container's
// spec, so that what is made from the container later (a fork's clones, a
// restore, a recreated task) starts with the policy in force, not the one
// it was created with.
type PolicyRecorder interface {
	RecordPolicy(ctx context.Context, id string, p *api.NetworkPolicy) error
}

var _ PolicyRecorder = (*Containerd)(nil)

// RecordPolicy implements PolicyRecorder: the annotations of container
// id's spec replaced (an empty list removes its annotation).
func (c *Containerd) RecordPolicy(ctx context.Context, id string, p *api.NetworkPolicy) error {
	ctx = namespaces.WithNamespace(ctx, c.Namespace)
	ctr, err := c.Client.LoadContainer(ctx, id)
	if err != nil {
		return fmt.Errorf("container %s: %w", id, err)
	}
	update := func(_ context.Context, _ *containerd.Client, info *containers.Container) error {
		if info.Spec == nil {
			return fmt.Errorf("container %s has no spec", id)
		}
		v, err := typeurl.UnmarshalAny(info.Spec)
		if err != nil {
			return fmt.Errorf("container %s's spec: %w", id, err)
		}
		spec, ok := v.(*specs.Spec)
		if !ok {
			return fmt.Errorf("container %s's spec is a %T", id, v)
		}
		if spec.Annotations == nil {
			spec.Annotations = map[string]string{}
		}
		for k, val := range PolicyAnnotations(p) {
			if val == "" {
				delete(spec.Annotations, k)
			} else {
				spec.Annotations[k] = val
			}
		}
		info.Spec, err = typeurl.MarshalAnyToProto(spec)
		return err
	}
	if err := ctr.Update(ctx, update); err != nil {
		return fmt.Errorf("record the egress policy in container %s's spec: %w", id, err)
	}
	return nil
}
