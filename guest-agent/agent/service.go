package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/ttrpc"
	"github.com/cube-runtime/cube/guest-agent/container"
	"github.com/cube-runtime/cube/guest-agent/initsys"
	"github.com/cube-runtime/cube/guest-agent/netif"
	"github.com/cube-runtime/cube/guest-agent/protocol"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// Version is the agent's version, set at link time
// (-ldflags "-X github.com/cube-runtime/cube/guest-agent/agent.Version=…").
var Version = "dev"

// Config wires the service to its environment. Zero values are the guest's
// defaults; tests point them elsewhere.
type Config struct {
	// Reaper collects all children; required.
	Reaper *initsys.Reaper
	Log    logrus.FieldLogger
	// HelperPath is the binary re-executed as container helper
	// (default /proc/self/exe).
	HelperPath string
	// SysBlock and DevDir locate disks by serial (default /sys/block, /dev).
	SysBlock, DevDir string
	// DiskRoot is where MountDisk mounts by default (/run/cube/disks).
	DiskRoot string
	// DiskSettleTimeout bounds how long MountDisk waits for a re-pointed
	// disk's new capacity to reach the guest (default 10s).
	DiskSettleTimeout time.Duration
	// PowerOff turns the machine off; nil: PowerOff answers Unavailable.
	PowerOff func() error
	// SetClock steps the wall clock (default clock_settime(CLOCK_REALTIME)).
	SetClock func(time.Time) error
	// CgroupRoot is the cgroup2 directory holding one cgroup per container
	// (default /sys/fs/cgroup/cube; "-" disables cgroups). Without a usable
	// cgroup2 parent the agent falls back to following the process tree.
	CgroupRoot string
	// RandomDevice gets RNDADDENTROPY/RNDRESEEDCRNG (default /dev/random);
	// HWRNG is read after a transport reset (default /dev/hwrng).
	RandomDevice, HWRNG string
	// ResolvConf is the file ConfigureNetwork writes DNS into (default
	// /etc/resolv.conf); ApplyNetwork configures the interfaces (default
	// netif.Apply, in the agent's network namespace).
	ResolvConf   string
	ApplyNetwork func(netif.Config) ([]netif.Applied, error)
	// VolumeRoot holds SyncTree's directories (default
	// protocol.VolumeRoot); RunRoot PrepareVolume's (default
	// protocol.RunRoot).
	VolumeRoot, RunRoot string
}

type containerEntry struct {
	id     string
	rootfs string
	spec   *specs.Spec
	init   *process
	execs  map[string]*process
	cgroup *cgroup // nil without cgroups
}

// Service implements protocol.AgentService.
type Service struct {
	cfg     Config
	log     logrus.FieldLogger
	started time.Time

	mu         sync.Mutex
	containers map[string]*containerEntry
	disks      map[string]string // mount point → device
	frozen     map[string]bool
	// diskNamesMu guards diskNames: disk serial → block device, as the
	// last scan of SysBlock found them (findDisk).
	diskNamesMu sync.Mutex
	diskNames   map[string]diskName
	// treeMu serializes SyncTree and PrepareVolume.
	treeMu sync.Mutex
	// spareMu guards spare: a parked container helper (PrepareSpare).
	spareMu sync.Mutex
	spare   *container.Spare[initsys.Exit]

	resets    atomic.Uint64
	reseeds   atomic.Uint64 // successful CRNG reseeds (Health.rng_reseeds)
	lastReset atomic.Int64
	reseeding atomic.Bool
}

var _ protocol.AgentService = (*Service)(nil)

// New returns a service; cfg.Reaper must be running.
func New(cfg Config) (*Service, error) {
	if cfg.Reaper == nil {
		return nil, fmt.Errorf("agent: config without reaper")
	}
	if cfg.Log == nil {
		cfg.Log = logrus.StandardLogger()
	}
	if cfg.HelperPath == "" {
		cfg.HelperPath = "/proc/self/exe"
	}
	if cfg.SysBlock == "" {
		cfg.SysBlock = "/sys/block"
	}
	if cfg.DevDir == "" {
		cfg.DevDir = "/dev"
	}
	if cfg.DiskRoot == "" {
		cfg.DiskRoot = "/run/cube/disks"
	}
	if cfg.SetClock == nil {
		cfg.SetClock = func(t time.Time) error {
			ts := unix.NsecToTimespec(t.UnixNano())
			return unix.ClockSettime(unix.CLOCK_REALTIME, &ts)
		}
	}
	if cfg.CgroupRoot == "" {
		cfg.CgroupRoot = "/sys/fs/cgroup/cube"
	}
	cgRoot, err := cgroupRootUsable(cfg.CgroupRoot)
	if err != nil {
		cfg.Log.WithError(err).Warn("no per-container cgroups; tracking processes by parentage")
	}
	cfg.CgroupRoot = cgRoot
	if cfg.RandomDevice == "" {
		cfg.RandomDevice = "/dev/random"
	}
	if cfg.HWRNG == "" {
		cfg.HWRNG = "/dev/hwrng"
	}
	if cfg.VolumeRoot == "" {
		cfg.VolumeRoot = protocol.VolumeRoot
	}
	if cfg.RunRoot == "" {
		cfg.RunRoot = protocol.RunRoot
	}
	return &Service{
		cfg: cfg, log: cfg.Log, started: time.Now(),
		containers: map[string]*containerEntry{},
		disks:      map[string]string{},
		frozen:     map[string]bool{},
	}, nil
}

// Register adds the service to a ttrpc server.
func (s *Service) Register(srv *ttrpc.Server) {
	protocol.RegisterAgentService(srv, s)
}

func (s *Service) Version(ctx context.Context, _ *protocol.VersionRequest) (*protocol.VersionResponse, error) {
	var u unix.Utsname
	unix.Uname(&u)
	return &protocol.VersionResponse{
		AgentVersion:    Version,
		ProtocolVersion: protocol.ProtocolVersion,
		KernelRelease:   unix.ByteSliceToString(u.Release[:]),
	}, nil
}

func (s *Service) Health(ctx context.Context, _ *protocol.HealthRequest) (*protocol.HealthResponse, error) {
	return &protocol.HealthResponse{Ok: true, TransportResets: s.resets.Load(), RngReseeds: s.reseeds.Load(), UptimeNs: uint64(time.Since(s.started))}, nil
}

// lookup returns the container and the process (init when execID is "").
func (s *Service) lookup(containerID, execID string) (*containerEntry, *process, error) {
	if err := protocol.ValidateID("container", containerID); err != nil {
		return nil, nil, errInvalid("%v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.containers[containerID]
	if !ok {
		return nil, nil, errNotFound("container %q not found", containerID)
	}
	if execID == "" {
		return c, c.init, nil
	}
	p, ok := c.execs[execID]
	if !ok {
		return nil, nil, errNotFound("exec %q of container %q not found", execID, containerID)
	}
	return c, p, nil
}

func (s *Service) CreateContainer(ctx context.Context, req *protocol.CreateContainerRequest) (*protocol.CreateContainerResponse, error) {
	spec, rootfs, err := decodeCreate(req)
	if err != nil {
		return nil, err
	}
	if st, err := os.Stat(rootfs); err != nil || !st.IsDir() {
		return nil, errNotFound("container %q: rootfs %q is not a directory (is its disk mounted?)", req.ContainerId, rootfs)
	}

	// Reserve the id before the slow part so concurrent creates conflict.
	s.mu.Lock()
	if _, ok := s.containers[req.ContainerId]; ok {
		s.mu.Unlock()
		return nil, toStatus(errAlreadyExists(req.ContainerId), "create")
	}
	c := &containerEntry{id: req.ContainerId, rootfs: rootfs, spec: spec, execs: map[string]*process{}}
	s.containers[c.id] = c
	s.mu.Unlock()

	t0 := time.Now()
	o := container.SpawnOptions{Mode: container.ModeCreate, Spec: spec, Rootfs: rootfs}
	if s.cfg.CgroupRoot != "" {
		cg, err := newCgroup(s.cfg.CgroupRoot, c.id)
		if err != nil {
			s.mu.Lock()
			delete(s.containers, c.id)
			s.mu.Unlock()
			return nil, toStatus(err, "container %q", c.id)
		}
		c.cgroup, o.CgroupFD = cg, cg.fd
	}
	t1 := time.Now()
	p, err := s.prepare(c, "", req.Stdio, o, spec.Process)
	if err != nil {
		if c.cgroup != nil {
			c.cgroup.kill()
			c.cgroup.remove()
		}
		s.mu.Lock()
		delete(s.containers, c.id)
		s.mu.Unlock()
		return nil, err
	}
	s.mu.Lock()
	c.init = p
	s.mu.Unlock()
	timing := fmt.Sprintf("cgroup=%.1f prepare=%.1f %s", ms(t1.Sub(t0)), ms(time.Since(t1)), p.prepared.Timing)
	log := s.log.WithFields(logrus.Fields{"container": c.id, "pid": p.pid, "root_switch": p.rootSwitch})
	if p.newNetnsLoUp {
		log = log.WithFields(logrus.Fields{"netns": "new", "lo": "up"})
	}
	if p.rootSwitch != "pivot_root" {
		log.Warn("container created without pivot_root (is / still the initramfs?)")
	} else {
		// Debug: every byte on the console is a VM exit; the shim logs
		// the timing it gets back.
		log.WithField("ms", timing).Debug("container created")
	}
	return &protocol.CreateContainerResponse{Pid: uint32(p.pid), Timing: timing}, nil
}

// decodeCreate validates a create request without touching the system.
func decodeCreate(req *protocol.CreateContainerRequest) (*specs.Spec, string, error) {
	if err := protocol.ValidateID("container", req.ContainerId); err != nil {
		return nil, "", errInvalid("%v", err)
	}
	spec, err := container.DecodeSpec(req.Spec)
	if err != nil {
		return nil, "", toStatus(err, "container %q", req.ContainerId)
	}
	rootfs := req.Rootfs
	if rootfs == "" && spec.Root != nil {
		rootfs = spec.Root.Path
	}
	if rootfs == "" || !filepath.IsAbs(rootfs) {
		return nil, "", errInvalid("container %q: rootfs %q is not an absolute guest path", req.ContainerId, rootfs)
	}
	return spec, rootfs, nil
}

// decodeExec validates an exec request without touching the system.
func decodeExec(req *protocol.ExecProcessRequest) (*specs.Process, error) {
	if err := protocol.ValidateID("container", req.ContainerId); err != nil {
		return nil, errInvalid("%v", err)
	}
	if err := protocol.ValidateID("exec", req.ExecId); err != nil {
		return nil, errInvalid("%v", err)
	}
	proc, err := container.DecodeProcess(req.Process)
	if err != nil {
		return nil, toStatus(err, "exec %q", req.ExecId)
	}
	return proc, nil
}

func errAlreadyExists(id string) error {
	return fmt.Errorf("container %q: %w", id, unix.EEXIST)
}

// prepare sets up stdio and parks the helper before execve.
func (s *Service) prepare(c *containerEntry, execID string, stdio *protocol.Stdio, o container.SpawnOptions, proc *specs.Process) (*process, error) {
	p := &process{containerID: c.id, execID: execID, done: make(chan struct{})}
	var size *[2]uint16
	if proc.ConsoleSize != nil {
		size = &[2]uint16{uint16(proc.ConsoleSize.Width), uint16(proc.ConsoleSize.Height)}
	}
	child, err := p.setupStdio(stdio, proc.Terminal, size)
	if err != nil {
		return nil, err
	}
	o.Helper = s.cfg.HelperPath
	o.Stdin, o.Stdout, o.Stderr, o.Terminal = child[0], child[1], child[2], proc.Terminal
	prep, err := s.prepareHelper(c, o)
	closeChild(child) // the child has its copies (or failed)
	if err != nil {
		p.closeStdio()
		return nil, toStatus(err, "prepare %s", p.name())
	}
	p.pid, p.prepared, p.rootSwitch, p.newNetnsLoUp = prep.Pid, prep, prep.RootSwitch, prep.LoopbackUp
	if proc.Terminal {
		p.pty = prep.Console
		if sz := p.consoleSize; sz != nil && sz[0] > 0 && sz[1] > 0 {
			unix.IoctlSetWinsize(int(p.pty.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Col: sz[0], Row: sz[1]})
		}
	}
	go p.watch(prep.Exited)
	return p, nil
}

func (s *Service) ExecProcess(ctx context.Context, req *protocol.ExecProcessRequest) (*protocol.ExecProcessResponse, error) {
	proc, err := decodeExec(req)
	if err != nil {
		return nil, err
	}
	c, initp, err := s.lookup(req.ContainerId, "")
	if err != nil {
		return nil, err
	}
	if st, _ := initp.status(); st != stateRunning {
		return nil, errState("container %q is %s; exec needs it running", c.id, st)
	}
	s.mu.Lock()
	if _, ok := c.execs[req.ExecId]; ok {
		s.mu.Unlock()
		return nil, toStatus(fmt.Errorf("%w", unix.EEXIST), "exec %q of container %q", req.ExecId, c.id)
	}
	placeholder := &process{containerID: c.id, execID: req.ExecId, done: make(chan struct{})}
	c.execs[req.ExecId] = placeholder
	s.mu.Unlock()

	o := container.SpawnOptions{Mode: container.ModeExec, Process: proc, InitPid: initp.pid}
	if c.cgroup != nil {
		o.CgroupFD = c.cgroup.fd
	}
	p, err := s.prepare(c, req.ExecId, req.Stdio, o, proc)
	s.mu.Lock()
	if err != nil {
		delete(c.execs, req.ExecId)
	} else {
		c.execs[req.ExecId] = p
	}
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return &protocol.ExecProcessResponse{Pid: uint32(p.pid)}, nil
}

func (s *Service) Start(ctx context.Context, req *protocol.StartRequest) (*protocol.StartResponse, error) {
	_, p, err := s.lookup(req.ContainerId, req.ExecId)
	if err != nil {
		return nil, err
	}
	t := time.Now()
	if err := p.start(); err != nil {
		return nil, err
	}
	return &protocol.StartResponse{Pid: uint32(p.pid), Timing: fmt.Sprintf("exec=%.1f", ms(time.Since(t)))}, nil
}

func (s *Service) Signal(ctx context.Context, req *protocol.SignalRequest) (*protocol.Empty, error) {
	if req.Signal == 0 || req.Signal > 64 {
		return nil, errInvalid("signal %d out of range 1..64", req.Signal)
	}
	c, p, err := s.lookup(req.ContainerId, req.ExecId)
	if err != nil {
		return nil, err
	}
	if st, _ := p.status(); st == stateCreated {
		return nil, errState("%s is created but not started", p.name())
	}
	if req.All && req.ExecId == "" {
		pids, err := s.containerPids(c)
		if err != nil {
			return nil, err
		}
		for _, pid := range pids {
			unix.Kill(pid, unix.Signal(req.Signal))
		}
		return &protocol.Empty{}, nil
	}
	return &protocol.Empty{}, p.signal(unix.Signal(req.Signal))
}

func (s *Service) Wait(ctx context.Context, req *protocol.WaitRequest) (*protocol.WaitResponse, error) {
	_, p, err := s.lookup(req.ContainerId, req.ExecId)
	if err != nil {
		return nil, err
	}
	e, err := p.wait(ctx)
	if err != nil {
		return nil, err
	}
	r := &protocol.WaitResponse{ExitStatus: e.Code(), ExitedAtUnixNano: exitTime(e)}
	if e.Status.Signaled() {
		r.Signal = uint32(e.Status.Signal())
	}
	return r, nil
}

func (s *Service) State(ctx context.Context, req *protocol.StateRequest) (*protocol.StateResponse, error) {
	_, p, err := s.lookup(req.ContainerId, req.ExecId)
	if err != nil {
		return nil, err
	}
	st, e := p.status()
	return &protocol.StateResponse{Status: st.String(), Pid: uint32(p.pid), ExitStatus: e.Code(), ExitedAtUnixNano: exitTime(e)}, nil
}

func (s *Service) CloseStdin(ctx context.Context, req *protocol.CloseStdinRequest) (*protocol.Empty, error) {
	_, p, err := s.lookup(req.ContainerId, req.ExecId)
	if err != nil {
		return nil, err
	}
	return &protocol.Empty{}, p.closeStdin(ctx)
}

func (s *Service) ResizePty(ctx context.Context, req *protocol.ResizePtyRequest) (*protocol.Empty, error) {
	_, p, err := s.lookup(req.ContainerId, req.ExecId)
	if err != nil {
		return nil, err
	}
	return &protocol.Empty{}, p.resize(req.Width, req.Height)
}

func (s *Service) ListPids(ctx context.Context, req *protocol.ListPidsRequest) (*protocol.ListPidsResponse, error) {
	c, _, err := s.lookup(req.ContainerId, "")
	if err != nil {
		return nil, err
	}
	pids, err := s.containerPids(c)
	if err != nil {
		return nil, err
	}
	r := &protocol.ListPidsResponse{}
	for _, p := range pids {
		r.Pids = append(r.Pids, uint32(p))
	}
	return r, nil
}

// containerPids returns the live processes of a container: its init and
// exec processes and all their descendants (guest pids).
func (s *Service) containerPids(c *containerEntry) ([]int, error) {
	if c.cgroup != nil {
		pids, err := c.cgroup.pids()
		return pids, toStatus(err, "list processes of container %q", c.id)
	}
	s.mu.Lock()
	roots := map[int]bool{}
	for _, p := range append([]*process{c.init}, mapValues(c.execs)...) {
		if p == nil || p.pid == 0 {
			continue
		}
		if st, _ := p.status(); st != stateStopped {
			roots[p.pid] = true
		}
	}
	s.mu.Unlock()
	children, err := processTree()
	if err != nil {
		return nil, err
	}
	var out []int
	var walk func(int)
	seen := map[int]bool{}
	walk = func(pid int) {
		if seen[pid] {
			return
		}
		seen[pid] = true
		out = append(out, pid)
		for _, ch := range children[pid] {
			walk(ch)
		}
	}
	for pid := range roots {
		walk(pid)
	}
	sort.Ints(out)
	return out, nil
}

func mapValues(m map[string]*process) []*process {
	out := make([]*process, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// processTree maps each pid to its children from /proc/*/stat.
func processTree() (map[int][]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, toStatus(err, "list processes")
	}
	tree := map[int][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		// comm may contain spaces and parentheses: parse after the last ')'.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 || f[0] == "Z" {
			continue
		}
		ppid, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		tree[ppid] = append(tree[ppid], pid)
	}
	return tree, nil
}

func (s *Service) Delete(ctx context.Context, req *protocol.DeleteRequest) (*protocol.DeleteResponse, error) {
	c, p, err := s.lookup(req.ContainerId, req.ExecId)
	if err != nil {
		return nil, err
	}
	procs := []*process{p}
	if req.ExecId == "" {
		s.mu.Lock()
		procs = append(procs, mapValues(c.execs)...)
		s.mu.Unlock()
	}
	for _, q := range procs {
		if q.pid == 0 {
			// ExecProcess is still preparing it (placeholder entry).
			return nil, errState("%s is still being created", q.name())
		}
		st, _ := q.status()
		if st == stateStopped {
			continue
		}
		if !req.Force && st == stateRunning {
			return nil, errState("%s is running (pid %d); stop it or delete with force", q.name(), q.pid)
		}
	}
	// Kill what is left (created processes are parked helpers; force
	// allows killing running ones) and wait for the reaper to confirm.
	// Without a pid namespace, killing the init does not take its
	// descendants along: kill the whole tree.
	if req.Force && req.ExecId == "" && c.cgroup != nil {
		c.cgroup.kill()
	} else if req.Force && req.ExecId == "" {
		if pids, err := s.containerPids(c); err == nil {
			for _, pid := range pids {
				unix.Kill(pid, unix.SIGKILL)
			}
		}
	}
	for _, q := range procs {
		q.mu.Lock()
		if q.prepared != nil {
			q.prepared.Abort()
			q.prepared = nil
		} else if q.state != stateStopped && q.pid > 0 {
			unix.Kill(q.pid, unix.SIGKILL)
		}
		q.mu.Unlock()
	}
	for _, q := range procs {
		if _, err := q.wait(ctx); err != nil {
			return nil, err
		}
		q.mu.Lock()
		q.closeStdio()
		q.mu.Unlock()
	}
	if req.ExecId == "" && c.cgroup != nil {
		// Leftover daemons (outside a pid namespace) would keep the
		// cgroup busy: they go with their container.
		c.cgroup.kill()
		if err := c.cgroup.remove(); err != nil {
			s.log.WithError(err).Warn("delete container")
		}
	}
	s.mu.Lock()
	if req.ExecId == "" {
		delete(s.containers, c.id)
	} else {
		delete(c.execs, req.ExecId)
	}
	s.mu.Unlock()
	_, e := p.status()
	s.log.WithFields(logrus.Fields{"container": c.id, "exec": req.ExecId, "status": e.Code()}).Debug("deleted")
	return &protocol.DeleteResponse{ExitStatus: e.Code(), ExitedAtUnixNano: exitTime(e)}, nil
}

// ms is d in milliseconds with two decimals, as the shim's steps are logged.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
