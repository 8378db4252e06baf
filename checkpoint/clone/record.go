// Package clone makes new io.cube.v1 containers from VM snapshots of the
// store: Restore (`cube restore SNAPSHOT NEW_ID`) one, Fork (`cube fork
// CONTAINER -n N`) N from one running container. Each new container is a
// containerd container with its own id, rootfs snapshot and cgroup, whose task
// the shim creates from the store's snapshot directory without a copy:
// runc's task-create option CriuImagePath names the directory, containerd
// hands it to the shim as CreateTaskRequest.Checkpoint, and the shim restores
// the VM there, mapping the snapshot's memory files (docs/shim.md, "Restore").
package clone

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
)

// RecordName is the container record's file in a snapshot directory of
// the store, beside the VM snapshot's files (written before the store's
// commit: the snapshot is immutable afterwards).
const RecordName = "cube-container.json"

// RecordVersion is the record's format version.
const RecordVersion = 1

// maxRecord bounds the record read (the spec is most of it).
const maxRecord = 2 << 20

// Record is what a restore needs of the container a snapshot was taken of:
// containerd's view of it (its VM is the snapshot).
type Record struct {
	Version int `json:"version"`
	// Container and Namespace name the source (informational).
	Container string `json:"container"`
	Namespace string `json:"namespace"`
	// Image is the image its rootfs was made from; it must exist in the
	// restoring containerd, unpacked for Snapshotter.
	Image       string `json:"image"`
	Snapshotter string `json:"snapshotter"`
	// Runtime is the runtime's name (io.cube.v1).
	Runtime string `json:"runtime"`
	// Spec is its OCI runtime spec.
	Spec json.RawMessage `json:"spec"`
}

// validate checks a record read from a file (untrusted).
func (r *Record) validate() error {
	switch {
	case r.Version != RecordVersion:
		return fmt.Errorf("container record version %d, this cube reads %d", r.Version, RecordVersion)
	case r.Image == "" || r.Snapshotter == "" || r.Runtime == "":
		return errors.New("container record without image, snapshotter or runtime")
	case len(r.Spec) == 0 || !json.Valid(r.Spec):
		return errors.New("container record without a valid spec")
	}
	return nil
}

// WriteRecord writes r into the snapshot directory dir.
func WriteRecord(dir string, r Record) error {
	r.Version = RecordVersion
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+RecordName+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("container record: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, RecordName)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("container record: %w", err)
	}
	return nil
}

// ReadRecord reads the container record of the snapshot in dir.
func ReadRecord(dir string) (Record, error) {
	f, err := os.Open(filepath.Join(dir, RecordName))
	if errors.Is(err, os.ErrNotExist) {
		return Record{}, fmt.Errorf("snapshot %s has no container record (%s): it was not taken by `cube snapshot` of this version, so the container to restore it into is unknown: %w",
			dir, RecordName, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return Record{}, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxRecord+1))
	if err != nil {
		return Record{}, err
	}
	return parseRecord(b)
}

func parseRecord(b []byte) (Record, error) {
	if len(b) > maxRecord {
		return Record{}, fmt.Errorf("container record larger than %d bytes: %w", maxRecord, errdefs.ErrDataLoss)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return Record{}, fmt.Errorf("container record: %v: %w", err, errdefs.ErrDataLoss)
	}
	if err := r.validate(); err != nil {
		return Record{}, fmt.Errorf("%w: %w", err, errdefs.ErrDataLoss)
	}
	return r, nil
}
