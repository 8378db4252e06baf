package task

import (
	"fmt"
	"slices"

	"github.com/containerd/containerd/api/types"
	"github.com/containerd/errdefs"
)

// rootfsImage returns the ext4 image file of a cube-snapshotter rootfs
// mount. The image goes to the VM as a virtio-blk disk: the host never
// mounts it. Anything else (overlay from the default snapshotter, a
// pre-populated bundle rootfs) is refused with what to use instead.
func rootfsImage(mounts []*types.Mount) (string, error) {
	const hint = "io.cube.v1 runs containers from block images: use the cube snapshotter " +
		"(ctr run --snapshotter cube, nerdctl --snapshotter cube, or snapshotter = \"cube\" in the CRI runtime config)"
	if len(mounts) == 0 {
		return "", fmt.Errorf("no rootfs mount (a pre-populated bundle rootfs cannot be given to a VM); %s: %w", hint, errdefs.ErrInvalidArgument)
	}
	if len(mounts) > 1 {
		return "", fmt.Errorf("%d rootfs mounts, want one ext4 image; %s: %w", len(mounts), hint, errdefs.ErrInvalidArgument)
	}
	m := mounts[0]
	if m.Type != "ext4" {
		return "", fmt.Errorf("rootfs mount type %q is not supported; %s: %w", m.Type, hint, errdefs.ErrInvalidArgument)
	}
	if !slices.Contains(m.Options, "loop") {
		return "", fmt.Errorf("rootfs ext4 mount of %q is not a loop image (options %v); %s: %w", m.Source, m.Options, hint, errdefs.ErrInvalidArgument)
	}
	if m.Source == "" || m.Source[0] != '/' {
		return "", fmt.Errorf("rootfs image path %q is not absolute: %w", m.Source, errdefs.ErrInvalidArgument)
	}
	return m.Source, nil
}
