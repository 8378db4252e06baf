// Package task is the shim's containerd task API v3 service: each RPC maps
// onto a method of the sandbox VM (shim/sandbox) or of a guest process
// (shim/process). One service (one shim process) serves one sandbox VM and
// every container in it.
package task

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/shim/config"
	"github.com/cube-runtime/cube/shim/podnet"
	"github.com/cube-runtime/cube/shim/process"
	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/volume"
)

// SandboxIDAnnotation groups CRI pod containers into one VM.
const SandboxIDAnnotation = "io.kubernetes.cri.sandbox-id"

// ContainerTypeAnnotation is CRI's container type: "sandbox" marks a pod's
// pause container, "container" an app container.
const ContainerTypeAnnotation = "io.kubernetes.cri.container-type"

// SandboxFactory makes the (not yet started) sandbox VM for the first
// container of this shim. Tests swap it for fakes.
type SandboxFactory func(ctx context.Context, sandboxID string, cfg config.Config, spec *specs.Spec, bundle string) (*sandbox.Sandbox, error)

// Options configure a Service.
type Options struct {
	Namespace  string
	Publisher  events.Publisher
	Shutdown   shutdown.Service
	NewSandbox SandboxFactory
	// LoadConfig reads the shim config ("" = the default path).
	LoadConfig func(path string) (config.Config, error)
	Log        *logrus.Entry
	// VolumeSyncInterval: how often host volumes are compared with the
	// guest's copies (0: volume.DefaultInterval).
	VolumeSyncInterval time.Duration
}

// Service implements taskAPI.TTRPCTaskService.
type Service struct {
	o Options

	mu         sync.Mutex
	sb         *sandbox.Sandbox
	containers map[string]*container

	// bootMu serializes booting the sandbox VM (the first Create).
	bootMu sync.Mutex
	// lifecycleMu orders a process's start event before its exit event: Start
	// holds it from the agent call until the start event is queued.
	lifecycleMu sync.Mutex
	// events go to containerd in queue order, asynchronously (events.go).
	events *eventQueue
	// volumes keeps the guest's copies of host volumes and files in sync
	// while the sandbox runs (made with the sandbox).
	volumes *volume.Syncer
}

type container struct {
	id, bundle string
	rootfs     string // host image file
	stdio      stdioURIs
	init       *process.Process
	execs      map[string]*execProc
	// guestRoot is the guest mount point of the rootfs disk.
	guestRoot string
	volumes   volumeUse
	// podSandbox: the pod's pause container (CRI's container type
	// "sandbox"). It runs nothing but pause, so freezing the VM under it
	// (Pause, Checkpoint of an app container) changes nothing it does.
	podSandbox bool
}

type execProc struct {
	p     *process.Process
	stdio stdioURIs
}

type stdioURIs struct {
	stdin, stdout, stderr string
	terminal              bool
}

var _ taskAPI.TTRPCTaskService = (*Service)(nil)

// New returns a service with no sandbox yet (the first Create boots it).
func New(o Options) *Service {
	if o.Log == nil {
		o.Log = logrus.NewEntry(logrus.StandardLogger())
	}
	if o.LoadConfig == nil {
		o.LoadConfig = config.Load
	}
	if o.NewSandbox == nil {
		o.NewSandbox = ProcessSandboxFactory(o.Namespace, o.Log)
	}
	s := &Service{o: o, containers: map[string]*container{}}
	s.events = newEventQueue(func(ctx context.Context, topic string, ev events.Event) error {
		return s.o.Publisher.Publish(ctx, topic, ev)
	}, o.Log)
	if o.Shutdown != nil {
		// Ordering: the last events (the delete of the last container) go out
		// before the shim exits. pkg/shim gives the shutdown 5 s in all.
		o.Shutdown.RegisterCallback(func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, shutdownFlushTimeout)
			defer cancel()
			if err := s.events.flush(ctx); err != nil {
				s.o.Log.WithError(err).Warn("events not all handed to containerd before the shim exits")
			}
			return nil
		})
	}
	return s
}

// shutdownFlushTimeout bounds how long the shim's exit waits for queued
// events (pkg/shim gives up on a shutdown after 5 s).
const shutdownFlushTimeout = 3 * time.Second

// RegisterTTRPC implements shim.TTRPCService.
func (s *Service) RegisterTTRPC(server *ttrpc.Server) error {
	taskAPI.RegisterTTRPCTaskService(server, s)
	return nil
}

// ProcessSandboxFactory is the production factory: cube-vmm child process,
// agent over hybrid vsock, VMM placed in the container's cgroup.
func ProcessSandboxFactory(ns string, log *logrus.Entry) SandboxFactory {
	return func(ctx context.Context, id string, cfg config.Config, spec *specs.Spec, bundle string) (*sandbox.Sandbox, error) {
		to, err := cfg.Durations()
		if err != nil {
			return nil, err
		}
		cg := vmmCgroup(cfg, id, spec, log)
		vmm := &sandbox.ProcessVMM{Binary: cfg.VMM, Cgroup: cg, Log: log.WithField("sandbox", id)}
		network, err := sandboxNetwork(id, bundle, spec, log.WithField("sandbox", id))
		if err != nil {
			return nil, err
		}
		return sandbox.New(sandbox.Options{
			ID: id, Dir: SandboxDir(cfg.StateDir, ns, id),
			Kernel: cfg.Kernel, Initrd: cfg.Initrd, Cmdline: cfg.Cmdline,
			MemoryMiB: cfg.MemoryMiB, VCPUs: cfg.VCPUs, DiskSlots: int(cfg.DiskSlots), HugeTLB: cfg.HugeTLB,
			Template: cfg.Template, TemplateFor: templateFor(cfg, to, log.WithField("sandbox", id)), BootTimeout: to.Boot,
			VMM: vmm, Dial: sandbox.DialAgentTimeout(to.Agent), Cgroup: cg, Log: log.WithField("sandbox", id),
			Network: network, BlockClaimDir: filepath.Join(cfg.StateDir, sandbox.BlockClaimDirName),
			Standby: cfg.Standby,
		})
	}
}

// sandboxNetwork is the VM's network from the host: a CRI pod's CNI
// namespace, or the namespace the shim makes for a container's network
// hooks (nerdctl's CNI hook: shim/podnet), or none (nil interface, not a
// nil *podnet.Network).
func sandboxNetwork(id, bundle string, spec *specs.Spec, log *logrus.Entry) (sandbox.Network, error) {
	n, err := podnet.FromSpec(spec, log)
	if err != nil {
		return nil, err
	}
	if n != nil {
		return n, nil
	}
	h, err := podnet.HooksFromSpec(id, bundle, spec, log)
	if err != nil || h == nil {
		return nil, err
	}
	return h, nil
}

// vmmCgroup picks the cgroup for the VMM: the container spec's cgroupsPath
// (containerd sets /<namespace>/<id>; CRI the pod's path), else
// cgroup_parent/<id>. systemd-style "slice:prefix:name" paths are not
// supported yet: the VMM then stays in the shim's cgroup.
func vmmCgroup(cfg config.Config, id string, spec *specs.Spec, log *logrus.Entry) string {
	p := ""
	if spec != nil && spec.Linux != nil {
		p = spec.Linux.CgroupsPath
	}
	if p == "" && cfg.CgroupParent != "" {
		p = filepath.Join(cfg.CgroupParent, id)
	}
	if strings.Contains(p, ":") {
		log.WithField("cgroupsPath", p).Warn("systemd cgroup paths are not supported; the VMM stays in the shim's cgroup")
		return ""
	}
	return p
}

// SandboxDir is the sandbox's state dir: short (it holds Unix sockets,
// whose paths are limited to 108 bytes) and unique per namespace and id.
func SandboxDir(stateDir, ns, id string) string {
	h := sha256.Sum256([]byte(ns + "/" + id))
	return filepath.Join(stateDir, hex.EncodeToString(h[:8]))
}

func (s *Service) getContainer(id string) (*container, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A nil entry is an id reserved by a Create still in progress.
	c, ok := s.containers[id]
	if !ok || c == nil {
		return nil, fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	return c, nil
}

// SandboxOf returns the VM that runs container id (any container of the
// sandbox): what the shim's snapshot service (shim/snapshotsvc) works on.
// NotFound when this shim has no such container, FailedPrecondition when its
// VM is not booted.
func (s *Service) SandboxOf(id string) (*sandbox.Sandbox, error) {
	if _, err := s.getContainer(id); err != nil {
		return nil, fmt.Errorf("%w in this shim (namespace %s)", err, s.o.Namespace)
	}
	s.mu.Lock()
	sb := s.sb
	s.mu.Unlock()
	if sb == nil {
		return nil, fmt.Errorf("container %s: its VM is not booted: %w", id, errdefs.ErrFailedPrecondition)
	}
	return sb, nil
}

// getProcess finds a container's init (execID "") or an exec.
func (s *Service) getProcess(id, execID string) (*container, *process.Process, error) {
	c, err := s.getContainer(id)
	if err != nil {
		return nil, nil, err
	}
	if execID == "" {
		return c, c.init, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := c.execs[execID]
	if !ok || e == nil {
		return nil, nil, fmt.Errorf("exec %s in container %s: %w", execID, id, errdefs.ErrNotFound)
	}
	return c, e.p, nil
}

// hostPid is what the shim reports as a process's pid: the VMM's host pid
// (the guest pids mean nothing on the host; Pids lists them).
func (s *Service) hostPid() uint32 {
	s.mu.Lock()
	sb := s.sb
	s.mu.Unlock()
	if sb == nil {
		return 0
	}
	return uint32(sb.Pid())
}

func errOut(err error) error {
	if err == nil {
		return nil
	}
	return errgrpc.ToGRPC(err)
}

// watchSandbox ends every process when the VM dies (their agent Waits fail
// too; this covers a guest that hangs instead of closing connections).
func (s *Service) watchSandbox(sb *sandbox.Sandbox) {
	<-sb.Done()
	exit, unexpected := sb.Exit()
	s.closeVolumes()
	if !unexpected {
		return
	}
	s.o.Log.WithField("vmm_status", exit.Status).WithError(exit.Err).Error("sandbox VM died; ending its tasks")
	s.endAll(process.ExitVMGone)
}

// endAll marks every process of the VM exited with status (an exit event each).
func (s *Service) endAll(status uint32) {
	s.mu.Lock()
	var procs []*process.Process
	for _, c := range s.containers {
		if c == nil {
			continue
		}
		for _, e := range c.execs {
			if e != nil {
				procs = append(procs, e.p)
			}
		}
		procs = append(procs, c.init)
	}
	s.mu.Unlock()
	for _, p := range procs {
		p.SetExited(process.Exit{Status: status, At: time.Now()})
	}
}

func removeRecord(bundle string) {
	_ = os.Remove(filepath.Join(bundle, sandbox.RecordFile))
}

// startVolumes makes the sandbox's volume Syncer.
func (s *Service) startVolumes(sb *sandbox.Sandbox) {
	syncer := volume.NewSyncer(volume.SyncerOptions{
		Agent: func() volume.Agent {
			if a := sb.Agent(); a != nil {
				return a
			}
			return nil
		},
		Interval: s.o.VolumeSyncInterval,
		Log:      s.o.Log.WithField("sandbox", sb.ID()),
	})
	s.mu.Lock()
	s.volumes = syncer
	s.mu.Unlock()
}

// closeVolumes stops syncing volumes (the VM is gone or going).
func (s *Service) closeVolumes() {
	s.mu.Lock()
	syncer := s.volumes
	s.mu.Unlock()
	if syncer != nil {
		syncer.Close()
	}
}

// releaseVolumes stops syncing what only c mounted.
func (s *Service) releaseVolumes(c *container, use volumeUse) {
	s.mu.Lock()
	syncer, sb := s.volumes, s.sb
	s.mu.Unlock()
	for _, g := range use.shared {
		if sb == nil {
			break
		}
		if err := sb.UnshareHostDir(g); err != nil {
			s.o.Log.WithError(err).WithField("guest", g).Warn("host directory left bound in the sandbox's virtio-fs share")
		}
	}
	if syncer == nil {
		return
	}
	for _, g := range use.synced {
		syncer.Release(g)
	}
}
