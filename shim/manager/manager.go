// Package manager is the shim binary's process side (containerd's
// shim.Shim): `start` spawns (or reuses) the long-running shim serving a
// sandbox, `delete` cleans up after a shim that died, `-info` describes the
// runtime. Containers of one CRI pod share a shim, and so a VM, through the
// io.kubernetes.cri.sandbox-id annotation.
package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	bootapi "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/version"
	"github.com/containerd/typeurl/v2"
	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/task"
)

// RuntimeName is the containerd runtime this shim implements.
const RuntimeName = "io.cube.v1"

// HandledMountTypes are the rootfs mount types the shim handles itself (the
// image goes to the VM as a disk), advertised so containerd's mount manager
// leaves them alone.
var HandledMountTypes = []string{"ext4"}

// New returns the shim manager.
func New(name string) shim.Shim { return &manager{name: name} }

type manager struct{ name string }

func (m *manager) Name() string { return m.name }

// GroupID is the shim (and VM) a container belongs to: its CRI sandbox id,
// or its own id.
func GroupID(id string, annotations map[string]string) string {
	if g := annotations[task.SandboxIDAnnotation]; g != "" {
		return g
	}
	return id
}

func readAnnotations(bundle string) (map[string]string, error) {
	f, err := os.Open(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var s struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.NewDecoder(io.LimitReader(f, 1<<20)).Decode(&s); err != nil {
		return nil, fmt.Errorf("parse bundle config.json: %w", err)
	}
	return s.Annotations, nil
}

// Start implements shim.Shim: run `<self> -namespace … -id … -address …`
// as the long-running server on a socket named after the group, or return
// the address of the group's running shim.
func (m *manager) Start(ctx context.Context, opts *bootapi.BootstrapParams) (_ *bootapi.BootstrapResult, retErr error) {
	result := &bootapi.BootstrapResult{Version: 3, Protocol: "ttrpc"}
	ext, err := mountCapabilities()
	if err != nil {
		return nil, err
	}
	result.Extensions = append(result.Extensions, ext)

	id := opts.GetInstanceID()
	cwd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	ann, err := readAnnotations(cwd)
	if err != nil {
		return nil, err
	}
	group := GroupID(id, ann)
	socketDir := opts.GetSocketDir()
	if socketDir == "" {
		socketDir = filepath.Join(defaults.DefaultStateDir, "s")
	}
	address, err := shim.CreateSocketAddress(ctx, socketDir, opts.GetContainerdGrpcAddress(), group, false)
	if err != nil {
		return nil, err
	}
	socket, err := shim.NewSocket(address)
	if err != nil {
		if !shim.SocketEaddrinuse(err) {
			return nil, fmt.Errorf("create shim socket: %w", err)
		}
		// A pod member: its sandbox's shim is already serving.
		if shim.CanConnect(address) {
			result.Address = address
			return result, nil
		}
		if err := shim.RemoveSocket(address); err != nil {
			return nil, fmt.Errorf("remove stale shim socket: %w", err)
		}
		if socket, err = shim.NewSocket(address); err != nil {
			return nil, fmt.Errorf("create shim socket: %w", err)
		}
	}
	defer func() {
		if retErr != nil {
			socket.Close()
			_ = shim.RemoveSocket(address)
		}
	}()
	f, err := socket.File()
	if err != nil {
		return nil, err
	}
	defer f.Close()

	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"-namespace", ns, "-id", id, "-address", opts.GetContainerdGrpcAddress()}
	if opts.GetLogLevel() <= bootapi.LogLevel_LOG_LEVEL_DEBUG {
		args = append(args, "-debug")
	}
	cmd := exec.Command(self, args...)
	cmd.Dir = cwd
	cmd.Env = append(os.Environ(), "GOMAXPROCS=4")
	// Own process group: containerd restarting (and signalling its group)
	// must not take the shim, and so the running sandbox, with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.ExtraFiles = []*os.File{f} // fd 3: the listening socket pkg/shim serves on
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start shim server: %w", err)
	}
	go cmd.Wait() //nolint:errcheck // reaped; the server outlives this process
	if err := shim.AdjustOOMScore(cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("adjust shim oom score: %w", err)
	}
	result.Address = address
	return result, nil
}

func mountCapabilities() (*bootapi.Extension, error) {
	a, err := typeurl.MarshalAnyToProto(&types.MountCapabilities{Types: HandledMountTypes})
	if err != nil {
		return nil, fmt.Errorf("marshal mount capabilities: %w", err)
	}
	return &bootapi.Extension{Value: a}, nil
}

// Stop implements shim.Shim (the `delete` action, run when the shim serving
// id is gone): kill the VMM it left, remove its sockets and stub disks.
func (m *manager) Stop(ctx context.Context, id string) (shim.StopStatus, error) {
	cwd, err := os.Getwd()
	if err != nil {
		return shim.StopStatus{}, err
	}
	bundle := filepath.Join(filepath.Dir(cwd), id)
	st := shim.StopStatus{ExitedAt: time.Now(), ExitStatus: 128 + int(syscall.SIGKILL)}
	rec, err := sandbox.ReadRecord(bundle)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			// A pod member, or a container that never booted a VM: nothing of ours to clean.
			return st, nil
		}
		return st, err
	}
	if err := sandbox.Cleanup(rec); err != nil {
		logrus.WithError(err).WithField("sandbox", rec.SandboxID).Warn("cleanup after shim crash")
	}
	_ = os.Remove(filepath.Join(bundle, sandbox.RecordFile))
	st.Pid = rec.VMMPid
	return st, nil
}

// Info implements shim.Shim (`-info`).
func (m *manager) Info(ctx context.Context, optionsR io.Reader) (*types.RuntimeInfo, error) {
	return &types.RuntimeInfo{
		Name:    m.name,
		Version: &types.RuntimeVersion{Version: version.Version, Revision: version.Revision},
	}, nil
}
