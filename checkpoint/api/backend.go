// Package api is cube-api, the HTTP facade over containerd and the snapshot
// store (cmd/cube-api only wires it): sandboxes are containerd containers of
// runtime io.cube.v1 in a namespace of its own, their API state (template,
// metadata, timeout deadline) is in the containers' labels and snapshots are
// in the store, so a restart of cube-api loses nothing. Routes and field
// names follow E2B / CubeSandbox where the semantics match. docs/api.md is
// the user documentation; /openapi.json the machine-readable one.
package api

import (
	"context"
	"io"
	"syscall"
	"time"

	"github.com/cube-runtime/cube/checkpoint/snapshots"
	"github.com/cube-runtime/cube/checkpoint/store"
)

// Backend is what the handlers need of containerd and the shim
// (Containerd in the daemon; a fake in the unit tests). Errors carry errdefs
// classes: NotFound for an unknown sandbox or image, FailedPrecondition or
// Conflict for a state that refuses the operation.
type Backend interface {
	// CheckImage returns NotFound when containerd has no image ref.
	CheckImage(ctx context.Context, ref string) error
	// Create creates the container and starts its task.
	Create(ctx context.Context, spec CreateSpec) (Container, error)
	// List returns the containers that are sandboxes of cube-api.
	List(ctx context.Context) ([]Container, error)
	// Get returns sandbox id (NotFound when there is none).
	Get(ctx context.Context, id string) (Container, error)
	// Delete kills and deletes the task and deletes the container and its rootfs.
	Delete(ctx context.Context, id string) error
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
	// SetLabels sets (adds or replaces) labels of the container.
	SetLabels(ctx context.Context, id string, labels map[string]string) error
	// Exec starts a process in the sandbox, its stdio connected to io.
	Exec(ctx context.Context, id string, spec ExecSpec, io ExecIO) (Process, error)
	// Snapshot takes a snapshot of the sandbox's VM into the store.
	Snapshot(ctx context.Context, id string, names []string) (snapshots.Taken, error)
}

// Snapshots is the part of the store the handlers use (*store.Store).
type Snapshots interface {
	Get(ctx context.Context, ref string) (store.Snapshot, error)
	List(ctx context.Context, opts store.ListOptions) ([]store.Snapshot, string, error)
	Delete(ctx context.Context, ref string) error
}

// Container is a sandbox as containerd knows it.
type Container struct {
	ID      string
	Image   string
	Labels  map[string]string
	Created time.Time
	// Status is its task's ("running", "paused", "created", "stopped",
	// "unknown"; "" without a task).
	Status string
}

// CreateSpec is a container to create.
type CreateSpec struct {
	ID, Image string
	Env       []string // KEY=VALUE
	Labels    map[string]string
	// Command replaces the image's entrypoint and cmd when set.
	Command []string
}

// ExecSpec is a process to start in a sandbox.
type ExecSpec struct {
	Cmd  string
	Args []string
	Env  []string // KEY=VALUE, added to the sandbox's
	Cwd  string
	User string
}

// ExecIO connects a process's stdio. Stdin is nil without input.
type ExecIO struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// Process is a started exec.
type Process interface {
	Pid() uint32
	// Wait returns the exit code once the process exited and its output was
	// copied; it deletes the exec.
	Wait(ctx context.Context) (int, error)
	Kill(ctx context.Context, sig syscall.Signal) error
	// CloseStdin closes the process's stdin.
	CloseStdin(ctx context.Context) error
}
