package sandboxtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cube-runtime/cube/shim/sandbox"
)

// Agent is a fake guest agent. Processes are scripted by their args:
//
//	echo WORDS...  prints WORDS to stdout, exits 0
//	stderr WORDS... prints WORDS to stderr, exits 0
//	exit N         exits with status N
//	cat            copies stdin to stdout until EOF, exits 0
//	sleep          runs until a signal kills it (128+signal)
type Agent struct {
	mu         sync.Mutex
	containers map[string]*container
	mounts     map[string]string // mount point -> serial
	disks      func(serial string) (string, bool)
	nextPid    uint32
	dead       chan struct{}
	// Calls records method names in order.
	Calls   []string
	Resizes []string
	files   map[string]fakeFile
	specs   map[string][]byte // container id -> spec given to CreateContainer
	frozen  bool
	// resetCh is closed (and replaced) by Restore: the transport reset
	// that ends the Waits pending on the connections of before.
	resetCh chan struct{}
	// NetworkErr, when set, is ConfigureNetwork's answer.
	NetworkErr error
	networks   []sandbox.NetworkConfig
	// RenameErr, when set, is RenameContainer's answer (an agent without it).
	RenameErr error
	// BlockDeviceErr, when set, is BlockDevice's answer.
	BlockDeviceErr error
	// DialStreamErr, when set, is DialStream's answer.
	DialStreamErr error
	// FreshenErr, when set, is Freshen's answer.
	FreshenErr error
	// TreeErr, when set, is SyncTree's answer.
	TreeErr error
	trees   map[string]sandbox.Tree
	volumes []sandbox.VolumeRequest
}

type fakeFile struct {
	data []byte
	mode uint32
}

type container struct {
	id, rootfs string
	procs      map[string]*proc // "" is init
}

type proc struct {
	args     []string
	terminal bool
	pid      uint32
	want     sandbox.StdioFlags
	guest    map[sandbox.Stream]*os.File
	state    string // created, running, stopped
	sig      chan uint32
	exited   chan struct{}
	exit     sandbox.ExitStatus
	// gone is closed when a rollback drops or replaces the process: its
	// script ends without an exit.
	gone chan struct{}
}

// NewAgent returns an empty fake agent.
func NewAgent() *Agent {
	return &Agent{containers: map[string]*container{}, mounts: map[string]string{}, nextPid: 100, dead: make(chan struct{}), resetCh: make(chan struct{})}
}

func (a *Agent) setDisks(f func(string) (string, bool)) {
	a.mu.Lock()
	a.disks = f
	a.mu.Unlock()
}

var errDead = errors.New("fake agent: connection reset (vm gone)")

func (a *Agent) die() {
	a.mu.Lock()
	defer a.mu.Unlock()
	select {
	case <-a.dead:
	default:
		close(a.dead)
		// The VMM's vsock connections close with it: every stream sees EOF.
		for _, c := range a.containers {
			for _, p := range c.procs {
				for _, f := range p.guest {
					f.Close()
				}
			}
		}
	}
}

func (a *Agent) enter(name string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.Calls = append(a.Calls, name)
	select {
	case <-a.dead:
		return errDead
	default:
		return nil
	}
}

// CallLog returns the recorded method names in order (Calls, read under the
// lock: a process's Wait runs in the background).
func (a *Agent) CallLog() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.Calls...)
}

// CallCount counts recorded calls of one method.
func (a *Agent) CallCount(name string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, c := range a.Calls {
		if c == name {
			n++
		}
	}
	return n
}

// Mounts returns the guest mount points and the serial mounted there.
func (a *Agent) Mounts() map[string]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := map[string]string{}
	for k, v := range a.mounts {
		m[k] = v
	}
	return m
}

func (a *Agent) Health(ctx context.Context) error { return a.enter("Health") }

// BlockDevice answers for a drive of the fake VMM: /dev/vd<letter> of its
// slot number N, device numbers 253:16*N, the size asked for. BlockDeviceErr,
// when set, is the answer instead.
func (a *Agent) BlockDevice(ctx context.Context, serial string, size uint64) (sandbox.GuestBlockDevice, error) {
	if err := a.enter("BlockDevice"); err != nil {
		return sandbox.GuestBlockDevice{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.BlockDeviceErr != nil {
		return sandbox.GuestBlockDevice{}, a.BlockDeviceErr
	}
	if a.disks != nil {
		if _, ok := a.disks(serial); !ok {
			return sandbox.GuestBlockDevice{}, fmt.Errorf("no disk with serial %q", serial)
		}
	}
	for mp, s := range a.mounts {
		if s == serial {
			return sandbox.GuestBlockDevice{}, fmt.Errorf("disk %q is mounted at %s", serial, mp)
		}
	}
	n, err := strconv.Atoi(strings.TrimPrefix(serial, "cube-slot-"))
	if err != nil || n > 25 {
		return sandbox.GuestBlockDevice{}, fmt.Errorf("fake agent: serial %q is no cube-slot-N", serial)
	}
	return sandbox.GuestBlockDevice{Device: "/dev/vd" + string(rune('a'+n)), Major: 253, Minor: uint32(16 * n), Size: size}, nil
}

func (a *Agent) MountDisk(ctx context.Context, req sandbox.MountDiskRequest) (sandbox.MountedDisk, error) {
	mp, err := a.mountDisk(req)
	if err != nil {
		return sandbox.MountedDisk{}, err
	}
	return sandbox.MountedDisk{MountPoint: mp, Timing: "fake=0"}, nil
}

func (a *Agent) mountDisk(req sandbox.MountDiskRequest) (string, error) {
	if err := a.enter("MountDisk"); err != nil {
		return "", err
	}
	return a.mount(req)
}

// Freshen is SetTime, ReseedRandom and MountDisk in one call, recorded as
// "Freshen"; FreshenErr, when set, is its answer (an older agent's is one
// wrapping errdefs.ErrNotImplemented).
func (a *Agent) Freshen(ctx context.Context, req sandbox.FreshenRequest) (sandbox.MountedDisk, error) {
	if err := a.enter("Freshen"); err != nil {
		return sandbox.MountedDisk{}, err
	}
	if a.FreshenErr != nil {
		return sandbox.MountedDisk{}, a.FreshenErr
	}
	if err := errors.Join(checkTime(req.Time), checkEntropy(req.Entropy)); err != nil {
		return sandbox.MountedDisk{}, err
	}
	if req.Mount == nil {
		return sandbox.MountedDisk{}, nil
	}
	mp, err := a.mount(*req.Mount)
	if err != nil {
		return sandbox.MountedDisk{}, err
	}
	return sandbox.MountedDisk{MountPoint: mp, Timing: "fake=0"}, nil
}

// mount records req's disk as mounted.
func (a *Agent) mount(req sandbox.MountDiskRequest) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.disks != nil {
		if _, ok := a.disks(req.Serial); !ok {
			return "", fmt.Errorf("no disk with serial %q", req.Serial)
		}
	}
	mp := req.MountPoint
	if mp == "" {
		mp = "/run/cube/disks/" + req.Serial
	}
	if _, ok := a.mounts[mp]; ok {
		return "", fmt.Errorf("%s is already mounted", mp)
	}
	a.mounts[mp] = req.Serial
	return mp, nil
}

func (a *Agent) UnmountDisk(ctx context.Context, mp string) error {
	if err := a.enter("UnmountDisk"); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.mounts[mp]; !ok {
		return fmt.Errorf("%s is not mounted", mp)
	}
	delete(a.mounts, mp)
	return nil
}

func (a *Agent) newProc(args []string, terminal bool, want sandbox.StdioFlags) *proc {
	a.nextPid++
	return &proc{args: args, terminal: terminal, pid: a.nextPid, want: want, guest: map[sandbox.Stream]*os.File{},
		state: "created", sig: make(chan uint32, 8), exited: make(chan struct{}), gone: make(chan struct{})}
}

// PrepareSpare records the call ("PrepareSpare" in Calls) and does nothing else.
func (a *Agent) PrepareSpare(ctx context.Context) (string, error) {
	if err := a.enter("PrepareSpare"); err != nil {
		return "", err
	}
	return "fake=0", nil
}

func (a *Agent) CreateContainer(ctx context.Context, req sandbox.CreateContainerRequest) (sandbox.CreatedContainer, error) {
	pid, err := a.createContainer(req)
	if err != nil {
		return sandbox.CreatedContainer{}, err
	}
	return sandbox.CreatedContainer{Pid: pid, Timing: "fake=0"}, nil
}

func (a *Agent) createContainer(req sandbox.CreateContainerRequest) (uint32, error) {
	if err := a.enter("CreateContainer"); err != nil {
		return 0, err
	}
	var spec specs.Spec
	if err := json.Unmarshal(req.Spec, &spec); err != nil {
		return 0, fmt.Errorf("invalid spec: %w", err)
	}
	if spec.Process == nil {
		return 0, errors.New("invalid spec: no process")
	}
	// Like the real agent: a guest path, not the host bundle's "rootfs".
	if spec.Root == nil || !strings.HasPrefix(spec.Root.Path, "/") {
		return 0, fmt.Errorf("invalid spec: root.path %v is not absolute", spec.Root)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.containers[req.ContainerID]; ok {
		return 0, fmt.Errorf("container %s already exists", req.ContainerID)
	}
	if _, ok := a.mounts[req.Rootfs]; !ok {
		return 0, fmt.Errorf("rootfs %s is not a mounted disk", req.Rootfs)
	}
	p := a.newProc(spec.Process.Args, spec.Process.Terminal, req.Stdio)
	a.containers[req.ContainerID] = &container{id: req.ContainerID, rootfs: req.Rootfs, procs: map[string]*proc{"": p}}
	if a.specs == nil {
		a.specs = map[string][]byte{}
	}
	a.specs[req.ContainerID] = append([]byte(nil), req.Spec...)
	return p.pid, nil
}

func (a *Agent) ExecProcess(ctx context.Context, req sandbox.ExecProcessRequest) (uint32, error) {
	if err := a.enter("ExecProcess"); err != nil {
		return 0, err
	}
	var pr specs.Process
	if err := json.Unmarshal(req.Process, &pr); err != nil {
		return 0, fmt.Errorf("invalid process: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.containers[req.ContainerID]
	if !ok {
		return 0, fmt.Errorf("container %s: not found", req.ContainerID)
	}
	if _, ok := c.procs[req.ExecID]; ok {
		return 0, fmt.Errorf("exec %s already exists", req.ExecID)
	}
	p := a.newProc(pr.Args, pr.Terminal, req.Stdio)
	c.procs[req.ExecID] = p
	return p.pid, nil
}

func (a *Agent) lookup(cid, eid string) (*proc, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.containers[cid]
	if !ok {
		return nil, fmt.Errorf("container %s: not found", cid)
	}
	p, ok := c.procs[eid]
	if !ok {
		return nil, fmt.Errorf("process %s/%s: not found", cid, eid)
	}
	return p, nil
}

func (a *Agent) Start(ctx context.Context, cid, eid string) (uint32, string, error) {
	if err := a.enter("Start"); err != nil {
		return 0, "", err
	}
	p, err := a.lookup(cid, eid)
	if err != nil {
		return 0, "", err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if p.state != "created" {
		return 0, "", fmt.Errorf("process %s/%s is %s", cid, eid, p.state)
	}
	p.state = "running"
	go a.run(p)
	return p.pid, "exec=0.1", nil
}

// run plays the process's script. Unrequested streams go to io.Discard.
func (a *Agent) run(p *proc) {
	a.mu.Lock()
	stdin, stdout, stderr := p.guest[sandbox.Stdin], p.guest[sandbox.Stdout], p.guest[sandbox.Stderr]
	a.mu.Unlock()
	var out, errw io.Writer = io.Discard, io.Discard
	if stdout != nil {
		out = stdout
	}
	if stderr != nil {
		errw = stderr
	}
	status, signal := uint32(0), uint32(0)
	cmd := ""
	if len(p.args) > 0 {
		cmd = p.args[0]
	}
	switch cmd {
	case "echo":
		fmt.Fprintln(out, strings.Join(p.args[1:], " "))
	case "stderr":
		fmt.Fprintln(errw, strings.Join(p.args[1:], " "))
	case "exit":
		if len(p.args) > 1 {
			n, _ := strconv.Atoi(p.args[1])
			status = uint32(n)
		}
	case "cat":
		if stdin != nil {
			done := make(chan struct{})
			// Like the agent: the guest end of stdin closes once it is passed on.
			go func() { io.Copy(out, stdin); stdin.Close(); close(done) }()
			select {
			case <-done:
			case s := <-p.sig:
				status, signal = 128+s, s
			case <-a.dead:
				return
			case <-p.gone:
				return
			}
		}
	case "sleep":
		select {
		case s := <-p.sig:
			status, signal = 128+s, s
		case <-a.dead:
			return
		case <-p.gone:
			return
		}
	default:
		fmt.Fprintf(errw, "%s: not found\n", cmd)
		status = 127
	}
	a.mu.Lock()
	a.finish(p, status, signal)
	a.mu.Unlock()
}

// finish records an exit; a.mu is held.
func (a *Agent) finish(p *proc, status, signal uint32) {
	for _, f := range p.guest {
		f.Close()
	}
	p.state = "stopped"
	p.exit = sandbox.ExitStatus{Status: status, Signal: signal, ExitedAt: time.Now()}
	close(p.exited)
}

func (a *Agent) Signal(ctx context.Context, cid, eid string, sig uint32, all bool) error {
	if err := a.enter("Signal"); err != nil {
		return err
	}
	var targets []*proc
	if all {
		a.mu.Lock()
		c, ok := a.containers[cid]
		if ok {
			for _, p := range c.procs {
				targets = append(targets, p)
			}
		}
		a.mu.Unlock()
		if !ok {
			return fmt.Errorf("container %s: not found", cid)
		}
	} else {
		p, err := a.lookup(cid, eid)
		if err != nil {
			return err
		}
		targets = []*proc{p}
	}
	for _, p := range targets {
		a.mu.Lock()
		st := p.state
		if st == "created" && sig != 0 {
			// A process parked before execve dies of the signal at once.
			a.finish(p, 128+sig, sig)
			a.mu.Unlock()
			continue
		}
		a.mu.Unlock()
		if st != "running" {
			if !all {
				return fmt.Errorf("process %s/%s is %s", cid, eid, st)
			}
			continue
		}
		if sig == 0 {
			continue
		}
		// SIGCHLD and friends are ignored like a default-handling process would.
		if syscall.Signal(sig) == syscall.SIGCHLD || syscall.Signal(sig) == syscall.SIGWINCH {
			continue
		}
		p.sig <- sig
	}
	return nil
}

func (a *Agent) Wait(ctx context.Context, cid, eid string) (sandbox.ExitStatus, error) {
	if err := a.enter("Wait"); err != nil {
		return sandbox.ExitStatus{}, err
	}
	p, err := a.lookup(cid, eid)
	if err != nil {
		return sandbox.ExitStatus{}, err
	}
	a.mu.Lock()
	reset := a.resetCh
	a.mu.Unlock()
	select {
	case <-p.exited:
		a.mu.Lock()
		defer a.mu.Unlock()
		return p.exit, nil
	case <-a.dead:
		return sandbox.ExitStatus{}, errDead
	case <-reset:
		return sandbox.ExitStatus{}, errReset
	case <-ctx.Done():
		return sandbox.ExitStatus{}, ctx.Err()
	}
}

func (a *Agent) CloseStdin(ctx context.Context, cid, eid string) error {
	if err := a.enter("CloseStdin"); err != nil {
		return err
	}
	_, err := a.lookup(cid, eid)
	return err
}

func (a *Agent) ResizePty(ctx context.Context, cid, eid string, w, h uint32) error {
	if err := a.enter("ResizePty"); err != nil {
		return err
	}
	p, err := a.lookup(cid, eid)
	if err != nil {
		return err
	}
	if !p.terminal {
		return fmt.Errorf("process %s/%s has no terminal", cid, eid)
	}
	a.mu.Lock()
	a.Resizes = append(a.Resizes, fmt.Sprintf("%s/%s %dx%d", cid, eid, w, h))
	a.mu.Unlock()
	return nil
}

func (a *Agent) ListPids(ctx context.Context, cid string) ([]uint32, error) {
	if err := a.enter("ListPids"); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.containers[cid]
	if !ok {
		return nil, fmt.Errorf("container %s: not found", cid)
	}
	var pids []uint32
	for _, p := range c.procs {
		if p.state == "running" {
			pids = append(pids, p.pid)
		}
	}
	return pids, nil
}

func (a *Agent) Delete(ctx context.Context, cid, eid string, force bool) (sandbox.ExitStatus, error) {
	if err := a.enter("Delete"); err != nil {
		return sandbox.ExitStatus{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.containers[cid]
	if !ok {
		return sandbox.ExitStatus{}, fmt.Errorf("container %s: not found", cid)
	}
	p, ok := c.procs[eid]
	if !ok {
		return sandbox.ExitStatus{}, fmt.Errorf("process %s/%s: not found", cid, eid)
	}
	if p.state == "running" && !force {
		return sandbox.ExitStatus{}, fmt.Errorf("process %s/%s is running", cid, eid)
	}
	if eid == "" {
		delete(a.containers, cid)
	} else {
		delete(c.procs, eid)
	}
	return p.exit, nil
}

func (a *Agent) SyncFilesystems(ctx context.Context) error { return a.enter("SyncFilesystems") }

// FreezeFilesystems and ThawFilesystems record the call; Frozen says whether the fake's disks are frozen.
func (a *Agent) FreezeFilesystems(ctx context.Context) error {
	if err := a.enter("FreezeFilesystems"); err != nil {
		return err
	}
	a.mu.Lock()
	a.frozen = true
	a.mu.Unlock()
	return nil
}

func (a *Agent) ThawFilesystems(ctx context.Context) error {
	if err := a.enter("ThawFilesystems"); err != nil {
		return err
	}
	a.mu.Lock()
	a.frozen = false
	a.mu.Unlock()
	return nil
}

// Frozen says whether the guest's filesystems are frozen (FreezeFilesystems without a thaw since).
func (a *Agent) Frozen() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.frozen
}

func (a *Agent) SetTime(ctx context.Context, t time.Time) error {
	if err := checkTime(t); err != nil {
		return err
	}
	return a.enter("SetTime")
}

func (a *Agent) ReseedRandom(ctx context.Context, entropy []byte) error {
	if err := checkEntropy(entropy); err != nil {
		return err
	}
	return a.enter("ReseedRandom")
}

// checkTime and checkEntropy refuse what the agent refuses.
func checkTime(t time.Time) error {
	if t.IsZero() {
		return errors.New("zero time")
	}
	return nil
}

func checkEntropy(entropy []byte) error {
	if len(entropy) < 16 || len(entropy) > 4096 {
		return fmt.Errorf("entropy of %d bytes, want 16..4096", len(entropy))
	}
	return nil
}
func (a *Agent) PowerOff(ctx context.Context) error { return a.enter("PowerOff") }

// WriteFile records the file; File returns it.
func (a *Agent) WriteFile(ctx context.Context, path string, data []byte, mode uint32) error {
	if err := a.enter("WriteFile"); err != nil {
		return err
	}
	if !strings.HasPrefix(path, "/") {
		return fmt.Errorf("write %q: not absolute", path)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.files == nil {
		a.files = map[string]fakeFile{}
	}
	a.files[path] = fakeFile{data: append([]byte(nil), data...), mode: mode}
	return nil
}

// File returns what WriteFile wrote at path.
func (a *Agent) File(path string) (data []byte, mode uint32, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f, ok := a.files[path]
	return f.data, f.mode, ok
}

// Spec returns the spec CreateContainer got for container id.
func (a *Agent) Spec(id string) []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.specs[id]
}
func (a *Agent) Close() error { return nil }

// Containers returns the ids of the containers the agent holds.
func (a *Agent) Containers() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ids []string
	for id := range a.containers {
		ids = append(ids, id)
	}
	return ids
}

var _ sandbox.AgentClient = (*Agent)(nil)
var _ sandbox.VMM = (*VMM)(nil)
