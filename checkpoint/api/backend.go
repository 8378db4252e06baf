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
	"io/fs"
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
	// Rollback rolls the sandbox's VM back in place to the store's snapshot
	// ref (an id or a name): NotFound for an unknown snapshot, Conflict while
	// another snapshot or rollback of the sandbox runs (the shim's "busy").
	Rollback(ctx context.Context, id, ref string) (snapshots.RolledBack, error)
	// GuestProcesses lists the processes the sandbox's guest holds, also
	// those containerd forgot (a rollback brings back processes that exited
	// and were deleted after the snapshot).
	GuestProcesses(ctx context.Context, id string) ([]GuestProcess, error)
	// SignalGuest signals exec execID of the sandbox in the guest, also one
	// containerd forgot.
	SignalGuest(ctx context.Context, id, execID string, sig syscall.Signal) error
	// Files is the sandbox's file system (paths in the container's root).
	Files
}

// GuestProcess is a process of a sandbox as its guest holds it.
type GuestProcess struct {
	// ExecID is containerd's exec id ("" for the sandbox's init process).
	ExecID string
	Pid    uint32
	// Running: the guest runs it (else it exited and is not deleted yet).
	Running bool
	// Known: containerd knows it.
	Known bool
}

// Restorer is a Backend that can create a sandbox from a snapshot of the
// store (restore in the shim's Create). Until the Backend is one, creating
// from a snapshot answers 501.
type Restorer interface {
	// Restore creates the container of spec from snapshot sn (whose VM and
	// rootfs it restores) and starts its task.
	Restore(ctx context.Context, spec CreateSpec, sn store.Snapshot) (Container, error)
}

// Forker is a Backend that can fork a running sandbox. Until the Backend is
// one, fork answers 501.
type Forker interface {
	// Fork makes count sandboxes from sandbox id's state now: one temporary
	// snapshot, count restores, the snapshot deleted whatever happens. specs
	// are the new containers (their ids, labels); the results are in the
	// same order. allOrNothing: on any failure, the ones made are deleted.
	Fork(ctx context.Context, id string, specs []CreateSpec, allOrNothing bool) ([]ForkResult, error)
}

// ForkResult is one sandbox of a fork: its container, or why it failed.
type ForkResult struct {
	Container Container
	Err       error
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
	// "unknown"; "" without a task). List gives StatusUnknown to a sandbox
	// whose shim did not answer in time.
	Status string
}

// StatusUnknown is a Container's Status when its task's could not be read.
const StatusUnknown = "unknown"

// CreateSpec is a container to create.
type CreateSpec struct {
	ID, Image string
	Env       []string // KEY=VALUE
	Labels    map[string]string
	// Command replaces the image's entrypoint and cmd when set.
	Command []string
	// Network is the sandbox's first egress policy; nil: no network
	// (network.mode "none").
	Network *NetworkPolicy
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
	// ExecID is containerd's exec id (ExecIDPrefix and a random part).
	ExecID() string
	// Wait returns the exit code once the process exited and its output was
	// copied; it deletes the exec.
	Wait(ctx context.Context) (int, error)
	Kill(ctx context.Context, sig syscall.Signal) error
	// CloseStdin closes the process's stdin.
	CloseStdin(ctx context.Context) error
}

// Files are the file operations of a sandbox's data plane (the guest agent's
// through the shim's files service). Paths are absolute in the container's
// root; symlinks and ".." resolve inside it. Errors: NotFound (no such
// file), InvalidArgument (a bad path, a directory where a file is wanted),
// AlreadyExists, FailedPrecondition (the sandbox is not running).
type Files interface {
	// ReadFile reads up to length bytes (at most MaxFileChunk) at offset.
	ReadFile(ctx context.Context, id, path string, offset int64, length int) (FileChunk, error)
	// WriteFile writes data (at most MaxFileChunk bytes), truncating the file
	// first unless appending; a new file gets mode (0: 0644) and its parent
	// directories are made.
	WriteFile(ctx context.Context, id, path string, data []byte, mode fs.FileMode, appending bool) (int64, error)
	// Stat describes path (a symlink itself, not its target).
	Stat(ctx context.Context, id, path string) (FileInfo, error)
	// ListDir lists directory path's entries by name, at most limit of them
	// after the name after ("" from the start); more says whether others follow.
	ListDir(ctx context.Context, id, path, after string, limit int) (entries []FileInfo, more bool, err error)
	// Remove removes path; a directory only with recursive unless it is empty.
	Remove(ctx context.Context, id, path string, recursive bool) error
	// MakeDir makes directory path and its missing parents; created is false
	// when it existed already.
	MakeDir(ctx context.Context, id, path string, mode fs.FileMode) (created bool, err error)
}

// FileChunk is a piece of a file read.
type FileChunk struct {
	Data []byte
	// EOF: the chunk reaches the end of the file.
	EOF  bool
	Size int64
}

// FileInfo is a file's description.
type FileInfo struct {
	Name    string
	Path    string
	Type    string // "file", "dir", "symlink", "other"
	Size    int64
	Mode    fs.FileMode // permission bits
	ModTime time.Time
	// Target is a symlink's target.
	Target string
}

// MaxFileChunk bounds one read or write between cube-api and the guest
// agent (the agent's own bound, protocol.MaxFileChunk).
const MaxFileChunk = 2 << 20
