// Package shimclient finds the shim that runs a container and dials its
// snapshot service (cube.snapshot.v1, shim/snapshotapi), the way containerd
// finds a shim: containerd's state directory holds, per namespace and task, the
// bootstrap.json (or, from older containerds, the address file) the shim's
// start action answered; pod members share their sandbox's shim. When no such
// file is there, the socket address pkg/shim derives from containerd's
// address, the namespace and the sandbox group is tried.
//
// The package is the checkpoint layer's only way into the shim: it imports
// the shim's API package, nothing else of shim/.
package shimclient

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/ttrpc"

	api "github.com/cube-runtime/cube/shim/snapshotapi"
)

// RuntimeName is the containerd runtime of Cube's shim (shim/manager's).
const RuntimeName = "io.cube.v1"

// SandboxIDAnnotation groups CRI pod containers into one shim and VM (the
// shim's task.SandboxIDAnnotation).
const SandboxIDAnnotation = "io.kubernetes.cri.sandbox-id"

// DefaultState is containerd's default state directory (its `state`
// setting), where it keeps each task's bundle and the shims' sockets.
const DefaultState = "/run/containerd"

// TaskRuntimeDir is the runtime v2 plugin's directory in containerd's state
// directory: a bundle per namespace and task.
const TaskRuntimeDir = "io.containerd.runtime.v2.task"

// Group is the shim (and VM) a container belongs to: its CRI sandbox id, or
// its own id (shim/manager.GroupID).
func Group(id string, annotations map[string]string) string {
	if g := annotations[SandboxIDAnnotation]; g != "" {
		return g
	}
	return id
}

// TaskDir is containerd's bundle directory of task id in namespace ns.
func TaskDir(state, ns, id string) string {
	return filepath.Join(state, TaskRuntimeDir, ns, id)
}

// SocketAddress is the address pkg/shim gives the shim of a group
// (shim.CreateSocketAddress): a socket in containerd's state directory named
// by a hash of containerd's address, the namespace and the group.
func SocketAddress(state, containerdAddress, ns, group string) string {
	d := sha256.Sum256([]byte(filepath.Join(containerdAddress, ns, group)))
	return fmt.Sprintf("unix://%s/%x", filepath.Join(state, "s"), d)
}

// maxBootstrap bounds the bootstrap files read (containerd writes a few
// hundred bytes).
const maxBootstrap = 64 << 10

// ReadAddress returns the shim address containerd recorded in a task's
// bundle directory: bootstrap.json (containerd 2: {"address":…,"protocol":…}),
// else the address file (older containerds). NotFound when neither exists.
func ReadAddress(bundle string) (string, error) {
	path := filepath.Join(bundle, "bootstrap.json")
	b, err := readSmall(path)
	if err == nil {
		a, err := ParseBootstrap(b)
		if err != nil {
			return "", fmt.Errorf("%s: %w", path, err)
		}
		return a, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	b, err = readSmall(filepath.Join(bundle, "address"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("no bootstrap.json or address file in %s: %w", bundle, errdefs.ErrNotFound)
	}
	if err != nil {
		return "", err
	}
	if a := strings.TrimSpace(string(b)); a != "" {
		return a, nil
	}
	return "", fmt.Errorf("%s is empty: %w", filepath.Join(bundle, "address"), errdefs.ErrDataLoss)
}

// ParseBootstrap returns the ttrpc address in a bootstrap.json's contents
// ({"version":3,"address":"unix:///…","protocol":"ttrpc"}, as containerd
// writes the shim's start reply).
func ParseBootstrap(b []byte) (string, error) {
	var p struct {
		Address  string `json:"address"`
		Protocol string `json:"protocol"`
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return "", fmt.Errorf("%v: %w", err, errdefs.ErrDataLoss)
	}
	if p.Protocol != "" && !strings.EqualFold(p.Protocol, "ttrpc") {
		return "", fmt.Errorf("the shim speaks %q, not ttrpc (not Cube's shim?): %w", p.Protocol, errdefs.ErrNotImplemented)
	}
	if p.Address == "" || strings.ContainsAny(p.Address, "\x00\n") {
		return "", fmt.Errorf("no usable address (%.64q): %w", p.Address, errdefs.ErrDataLoss)
	}
	return p.Address, nil
}

func readSmall(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxBootstrap))
}

// Locator says where containerd keeps its shims.
type Locator struct {
	// State is containerd's state directory (DefaultState unless its config
	// says otherwise).
	State string
	// Address is containerd's gRPC address (for the derived socket address).
	Address string
	// Namespace is containerd's namespace of the container.
	Namespace string
}

// Find returns the shim address of container id of sandbox group group:
// the task's own bundle, then the sandbox's, then the derived socket.
func (l Locator) Find(id, group string) (string, error) {
	tried := []string{}
	ids := []string{id}
	if group != "" && group != id {
		ids = append(ids, group)
	}
	for _, i := range ids {
		dir := TaskDir(l.State, l.Namespace, i)
		a, err := ReadAddress(dir)
		if err == nil {
			return a, nil
		}
		if !errdefs.IsNotFound(err) {
			return "", err
		}
		tried = append(tried, dir)
	}
	if l.Address != "" && group != "" {
		a := SocketAddress(l.State, l.Address, l.Namespace, group)
		if _, err := os.Stat(socketPath(a)); err == nil {
			return a, nil
		}
		tried = append(tried, socketPath(a))
	}
	return "", fmt.Errorf("no shim address for container %s (namespace %s): none of %s exists: the container has no running task (`ctr -n %s task ls`), or containerd's state directory is not %s (pass --state, containerd's `state` setting): %w",
		id, l.Namespace, strings.Join(tried, ", "), l.Namespace, l.State, errdefs.ErrNotFound)
}

// socketPath is the file of a unix:// address (an abstract one starts with @).
func socketPath(address string) string {
	p, _ := strings.CutPrefix(address, "unix://")
	return p
}

// Client is a connection to a shim's snapshot service. Its errors carry
// errdefs classes (errdefs.IsUnavailable: the sandbox is busy, …) and the
// shim's message without the gRPC status prefix.
type Client struct {
	s api.SnapshotsService
	c *ttrpc.Client
}

// Snapshot calls the service's Snapshot.
func (c *Client) Snapshot(ctx context.Context, req *api.SnapshotRequest) (*api.SnapshotResponse, error) {
	r, err := c.s.Snapshot(ctx, req)
	return r, errgrpc.ToNative(err)
}

// List calls the service's List.
func (c *Client) List(ctx context.Context, req *api.ListRequest) (*api.ListResponse, error) {
	r, err := c.s.List(ctx, req)
	return r, errgrpc.ToNative(err)
}

// Inspect calls the service's Inspect.
func (c *Client) Inspect(ctx context.Context, req *api.InspectRequest) (*api.InspectResponse, error) {
	r, err := c.s.Inspect(ctx, req)
	return r, errgrpc.ToNative(err)
}

// Rollback calls the service's Rollback.
func (c *Client) Rollback(ctx context.Context, req *api.RollbackRequest) (*api.RollbackResponse, error) {
	r, err := c.s.Rollback(ctx, req)
	return r, errgrpc.ToNative(err)
}

// ListProcesses calls the service's ListProcesses.
func (c *Client) ListProcesses(ctx context.Context, req *api.ListProcessesRequest) (*api.ListProcessesResponse, error) {
	r, err := c.s.ListProcesses(ctx, req)
	return r, errgrpc.ToNative(err)
}

// Signal calls the service's Signal.
func (c *Client) Signal(ctx context.Context, req *api.SignalRequest) (*api.SignalResponse, error) {
	r, err := c.s.Signal(ctx, req)
	return r, errgrpc.ToNative(err)
}

// SetNetworkPolicy calls the service's SetNetworkPolicy.
func (c *Client) SetNetworkPolicy(ctx context.Context, req *api.SetNetworkPolicyRequest) (*api.NetworkPolicyResponse, error) {
	r, err := c.s.SetNetworkPolicy(ctx, req)
	return r, errgrpc.ToNative(err)
}

// GetNetworkPolicy calls the service's GetNetworkPolicy.
func (c *Client) GetNetworkPolicy(ctx context.Context, req *api.GetNetworkPolicyRequest) (*api.NetworkPolicyResponse, error) {
	r, err := c.s.GetNetworkPolicy(ctx, req)
	return r, errgrpc.ToNative(err)
}

// Close closes the connection.
func (c *Client) Close() error { return c.c.Close() }

// Dial connects to the shim at address (unix://PATH, as containerd records
// it), within ctx.
func Dial(ctx context.Context, address string) (*Client, error) {
	proto, path, ok := strings.Cut(address, "://")
	if !ok {
		proto, path = "unix", address
	}
	if proto != "unix" {
		return nil, fmt.Errorf("shim address %q: only unix:// sockets are supported: %w", address, errdefs.ErrNotImplemented)
	}
	d := net.Dialer{Timeout: 10 * time.Second}
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("dial the shim at %s: %w: %w", address, err, errdefs.ErrUnavailable)
	}
	c := ttrpc.NewClient(conn)
	return &Client{s: api.NewSnapshotsClient(c), c: c}, nil
}
