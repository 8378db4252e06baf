package snapshotter

import (
	"context"
	"fmt"
	"os"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/snapshotter/imagefile"
)

// create builds the image outside the metadata lock (mkfs and copies can be
// slow), then records the snapshot and renames the image into place in one
// write transaction.
func (s *Snapshotter) create(ctx context.Context, kind snapshots.Kind, key, parent string, opts []snapshots.Opt) (_ []mount.Mount, retErr error) {
	fail := func(err error) ([]mount.Mount, error) {
		return nil, fmt.Errorf("create %v snapshot %q (parent %q): %w", kind, key, parent, err)
	}
	if key == "" {
		return fail(fmt.Errorf("empty key: %w", errdefs.ErrInvalidArgument))
	}
	labels := labelsOf(opts)
	if err := validateSizeLabel(labels); err != nil {
		return fail(err)
	}

	// Early checks in a read transaction avoid building an image that the
	// write transaction would reject; CreateSnapshot checks again.
	var parentID string
	var parentKind snapshots.Kind
	err := s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		if _, _, _, err := storage.GetInfo(ctx, key); err == nil {
			return fmt.Errorf("snapshot %q: %w", key, errdefs.ErrAlreadyExists)
		} else if !errdefs.IsNotFound(err) {
			return err
		}
		if parent == "" {
			return nil
		}
		var info snapshots.Info
		var err error
		parentID, info, _, err = storage.GetInfo(ctx, parent)
		if err != nil {
			return fmt.Errorf("parent: %w", err)
		}
		parentKind = info.Kind
		return nil
	})
	if err != nil {
		return fail(err)
	}
	if parent != "" && parentKind != snapshots.KindCommitted {
		return fail(fmt.Errorf("parent %q is %v, not committed: %w", parent, parentKind, errdefs.ErrInvalidArgument))
	}

	var tmp string
	if kind == snapshots.KindActive || parent == "" {
		f, err := os.CreateTemp(s.tmpDir, "new-*.img")
		if err != nil {
			return fail(err)
		}
		tmp = f.Name()
		f.Close()
		// The builders create the file exclusively.
		if err := os.Remove(tmp); err != nil {
			return fail(err)
		}
		defer func() {
			if retErr != nil && tmp != "" {
				_ = os.Remove(tmp)
			}
		}()
		if err := s.build(ctx, tmp, parentID, labels); err != nil {
			return fail(err)
		}
	}

	var sn storage.Snapshot
	var final string
	err = s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		var err error
		sn, err = storage.CreateSnapshot(ctx, kind, key, parent, opts...)
		if err != nil {
			return err
		}
		if parent != "" && (len(sn.ParentIDs) == 0 || sn.ParentIDs[0] != parentID) {
			return fmt.Errorf("parent %q was replaced while its image was cloned: %w", parent, errdefs.ErrAborted)
		}
		if tmp == "" {
			return nil
		}
		// Ordering: rename, then fsync the directory, both before the
		// transaction commits, so a committed record always has its file.
		final = s.imagePath(sn.ID)
		if err := os.Rename(tmp, final); err != nil {
			final = ""
			return fmt.Errorf("rename image into place: %w", err)
		}
		tmp = ""
		return imagefile.SyncDir(s.imgDir)
	})
	if err != nil {
		if final != "" {
			// The record did not commit; its id may be handed out again.
			_ = os.Remove(final)
		}
		return fail(err)
	}
	return s.mounts(sn), nil
}

// build writes the image for a new snapshot at tmp: a fresh ext4 image, or a
// reflink/copy of the parent's, grown if a size label asks for more.
func (s *Snapshotter) build(ctx context.Context, tmp, parentID string, labels map[string]string) error {
	size, explicit, err := sizeFromLabels(labels, s.opts.DefaultSize)
	if err != nil {
		return err
	}
	if parentID == "" {
		return imagefile.CreateExt4(ctx, tmp, size, s.opts.Ext4)
	}
	src := s.imagePath(parentID)
	if s.mode == imagefile.ModeReflink {
		err = imagefile.Clone(tmp, src)
	} else {
		err = imagefile.Copy(tmp, src)
	}
	if err != nil {
		return err
	}
	if explicit {
		st, err := os.Stat(tmp)
		if err != nil {
			return err
		}
		if size < st.Size() {
			return fmt.Errorf("label %s=%q is smaller than the parent image (%d bytes); images only grow: %w",
				LabelSize, labels[LabelSize], st.Size(), errdefs.ErrInvalidArgument)
		}
		return imagefile.Grow(ctx, tmp, size)
	}
	return nil
}

func labelsOf(opts []snapshots.Opt) map[string]string {
	var info snapshots.Info
	for _, o := range opts {
		if err := o(&info); err != nil {
			return nil // storage.CreateSnapshot reports the same error
		}
	}
	return info.Labels
}

// sizeFromLabels picks the image size: our label, else containerd's generic
// max-size hint, else the default. explicit reports whether a label set it.
func sizeFromLabels(labels map[string]string, def int64) (size int64, explicit bool, err error) {
	if v, ok := labels[LabelSize]; ok {
		n, err := imagefile.ParseSize(v)
		if err != nil {
			return 0, false, fmt.Errorf("label %s: %v: %w", LabelSize, err, errdefs.ErrInvalidArgument)
		}
		return n, true, nil
	}
	if v, ok := labels[snapshots.LabelSnapshotMaxSize]; ok {
		n, err := imagefile.ParseSize(v)
		if err != nil {
			return 0, false, fmt.Errorf("label %s: %v: %w", snapshots.LabelSnapshotMaxSize, err, errdefs.ErrInvalidArgument)
		}
		return n, true, nil
	}
	return def, false, nil
}

func validateSizeLabel(labels map[string]string) error {
	_, _, err := sizeFromLabels(labels, imagefile.MinSize)
	return err
}
