package container

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// A spare is a container helper forked before any container asks for it:
// cloned with a new container's namespaces, its lo brought up when it has
// a network namespace of its own, then parked until a create hands it the
// container's stdio and config. A template VM is snapshotted with one
// (the agent's PrepareSpare), so the first container of every sandbox
// restored from it skips the fork, the helper's execve and Go start, and
// the new network namespace: in a guest they cost more than the rest of
// the create.
//
// The handoff, on the spare's fd 6 (a SOCK_SEQPACKET socket): one message
// whose SCM_RIGHTS carry stdin, stdout, stderr and, for a terminal
// process, the console socket, which then takes fd 6 (consoleFd). The
// config follows on fd 3 as for any helper, and the status pipe reports
// "parked" once, then what Prepare reads.
//
// The mount namespace the spare was cloned with is a copy of the agent's
// when the template was made: the container's rootfs disk, mounted by the
// agent after the restore, is not in it. So at the handoff the spare
// enters the agent's mount namespace (fd 7, kept from the fork: a
// namespace fd follows the namespace as it changes) and unshares a fresh
// copy of it, as a forked helper's clone would have.

const (
	spareArg      = "spare"   // argv[1] of a spare helper
	spareLoUp     = "lo"      // in argv[2:]: bring lo up (new network namespace)
	spareNewMnt   = "mnt"     // in argv[2:]: a mount namespace of its own
	handoffFd     = consoleFd // the spare's end of the handoff socket
	agentMntFd    = 7         // the agent's mount namespace
	maxHandoffFds = 4
)

// DefaultSpareNamespaces are the namespaces containerd's default spec gives
// a container (ctr run, nerdctl run): a spare made with them serves it.
var DefaultSpareNamespaces = []specs.LinuxNamespaceType{
	specs.PIDNamespace, specs.IPCNamespace, specs.UTSNamespace, specs.MountNamespace, specs.NetworkNamespace,
}

// Spare is a parked helper (PrepareSpare). Take hands it a container;
// Discard kills it.
type Spare[E any] struct {
	Pid    int
	Exited <-chan E
	// Timing: what making it took ("fork=… exec=… lo=…", ms).
	Timing  string
	flags   uintptr
	handoff *os.File
	cfgW    *os.File
	start   *os.File
	statF   *os.File
	status  *bufio.Reader
}

// PrepareSpare forks a helper (helper: the agent binary, "" for
// /proc/self/exe) cloned with the namespaces nss and waits until it is
// parked.
func PrepareSpare[E any](helper string, nss []specs.LinuxNamespaceType, starter Starter[E]) (*Spare[E], error) {
	var flags uintptr
	for _, t := range nss {
		f, ok := namespaceFlags[t]
		if !ok {
			return nil, invalidf("spare helper: unknown namespace %q", t)
		}
		flags |= f
	}
	if helper == "" {
		helper = "/proc/self/exe"
	}
	files, err := newHelperFiles()
	if err != nil {
		return nil, err
	}
	defer files.closeChild()
	handoff, child, err := socketPair("handoff")
	if err != nil {
		files.closeOurs()
		return nil, err
	}
	files.child = append(files.child, child) // fd 6
	mntNS, err := os.Open("/proc/self/ns/mnt")
	if err != nil {
		handoff.Close()
		files.closeOurs()
		return nil, fmt.Errorf("open the agent's mount namespace: %w", err)
	}
	files.child = append(files.child, mntNS) // fd 7
	args := []string{InitArg0, spareArg}
	if flags&unix.CLONE_NEWNET != 0 {
		args = append(args, spareLoUp)
	}
	if flags&unix.CLONE_NEWNS != 0 {
		args = append(args, spareNewMnt)
	}
	h := helperProc{path: helper, args: args, stdio: [3]*os.File{files.devNull, files.devNull, files.devNull},
		extra: files.child, cloneFlags: flags}
	pid, exited, err := startHelper(&h, starter)
	if err != nil {
		handoff.Close()
		files.closeOurs()
		return nil, err
	}
	sp := &Spare[E]{Pid: pid, Exited: exited, flags: flags, handoff: handoff, cfgW: files.cfgW, start: files.startW,
		statF: files.statR, status: bufio.NewReader(files.statR)}
	p := sp.prepared()
	m, err := p.readStatus()
	if err == nil && (m == nil || m.Stage != "parked") {
		err = fmt.Errorf("spare helper exited before it was parked")
	}
	if err != nil {
		sp.Discard()
		return nil, err
	}
	sp.Timing = h.timing(m.EnteredNS) + " " + m.StagesMS
	return sp, nil
}

func (sp *Spare[E]) prepared() *Prepared[E] {
	return &Prepared[E]{Pid: sp.Pid, Exited: sp.Exited, start: sp.start, statF: sp.statF, status: sp.status}
}

// Fits reports whether the spare can be the container of o: a create whose
// spec asks for exactly the spare's namespaces, none of them by path (so
// no pid namespace to enter either).
func (sp *Spare[E]) Fits(o SpawnOptions) bool {
	if o.Mode != ModeCreate || o.Spec == nil || o.Spec.Linux == nil {
		return false
	}
	for _, ns := range o.Spec.Linux.Namespaces {
		if ns.Path != "" {
			return false
		}
	}
	return CloneFlags(o.Spec) == sp.flags
}

// ErrSpareGone: the spare had died before Take could hand it a container;
// nothing of the container was set up, so the caller may fork a helper.
var ErrSpareGone = errors.New("the spare container helper is gone")

// Take makes the spare the helper of o (which it Fits), the container's
// cgroup already holding it (o.CgroupFD is not used: the spare was forked
// before the cgroup existed; the caller moves it). The spare is used up
// whatever the outcome.
func (sp *Spare[E]) Take(o SpawnOptions) (*Prepared[E], error) {
	t0 := monotonicNS()
	defer sp.handoff.Close()
	cfg, _, _, err := initConfig(o) // no joins: the spare Fits
	if err != nil {
		sp.Discard()
		return nil, err
	}
	payload, err := json.Marshal(cfg)
	if err != nil {
		sp.Discard()
		return nil, fmt.Errorf("encode init config: %w", err)
	}
	devNull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		sp.Discard()
		return nil, fmt.Errorf("open /dev/null: %w", err)
	}
	defer devNull.Close()
	fds := make([]int, 0, maxHandoffFds)
	for _, f := range []*os.File{o.Stdin, o.Stdout, o.Stderr} {
		if f == nil {
			f = devNull
		}
		fds = append(fds, int(f.Fd()))
	}
	var console *os.File
	if o.Terminal {
		var child *os.File
		if console, child, err = socketPair("console-socket"); err != nil {
			sp.Discard()
			return nil, err
		}
		defer console.Close()
		defer child.Close()
		fds = append(fds, int(child.Fd()))
	}
	if err := unix.Sendmsg(int(sp.handoff.Fd()), []byte{byte(len(fds))}, unix.UnixRights(fds...), nil, 0); err != nil {
		sp.Discard()
		if errors.Is(err, unix.EPIPE) || errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ECONNRESET) {
			return nil, fmt.Errorf("%w: %v", ErrSpareGone, err)
		}
		return nil, fmt.Errorf("hand the container to the spare helper: %w", err)
	}
	p := sp.prepared()
	m, err := p.await(sp.cfgW, payload, console)
	if err != nil {
		return nil, err
	}
	p.Timing = fmt.Sprintf("spare=1 handoff=%.1f %s ready=%.1f", nsMS(m.EnteredNS-t0), m.StagesMS, nsMS(monotonicNS()-t0))
	return p, nil
}

// Discard kills the spare and closes our ends of its pipes.
func (sp *Spare[E]) Discard() {
	sp.handoff.Close()
	sp.cfgW.Close()
	sp.prepared().Abort()
}

// runSpare is the spare's side: lo up if asked, "parked", then the handoff
// (stdio, the console socket) and on as any helper (runInit).
func runSpare(status *os.File, entered int64) error {
	st := newStages(entered)
	unix.CloseOnExec(handoffFd)
	unix.CloseOnExec(agentMntFd)
	loUp, newMnt := slices.Contains(os.Args[2:], spareLoUp), slices.Contains(os.Args[2:], spareNewMnt)
	if loUp {
		if err := loopbackUp(); err != nil {
			return err
		}
		st.mark("lo")
	}
	WarmJSON()
	st.mark("warm")
	writeStatus(status, statusMsg{Stage: "parked", EnteredNS: entered, StagesMS: st.String()})
	n, fds, err := recvFds(handoffFd, maxHandoffFds)
	if n == 0 {
		// The agent dropped the spare (or died): nothing to set up.
		os.Exit(0)
	}
	handed := monotonicNS()
	if err != nil || len(fds) < 3 || len(fds) > maxHandoffFds {
		return fmt.Errorf("spare helper: handoff with %d file descriptors, want 3 or 4 (%v)", len(fds), err)
	}
	// Ordering: stdio first; the console socket then replaces the handoff
	// socket on fd 6 (or the handoff socket is closed).
	for i, fd := range fds[:3] {
		if err := unix.Dup3(fd, i, 0); err != nil {
			return fmt.Errorf("spare helper: stdio fd %d: %w", i, err)
		}
	}
	if len(fds) == 4 {
		if err := unix.Dup3(fds[3], consoleFd, 0); err != nil {
			return fmt.Errorf("spare helper: console socket: %w", err)
		}
	} else {
		unix.Close(handoffFd)
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	if newMnt {
		if err := freshMountNamespace(); err != nil {
			return err
		}
	}
	unix.Close(agentMntFd)
	return runInit(status, handed, loUp)
}

// freshMountNamespace replaces the spare's mount namespace (a copy of the
// agent's at the fork) with a copy of the agent's as it is now.
func freshMountNamespace() error {
	// setns(CLONE_NEWNS) refuses a thread sharing its fs_struct with
	// other threads, which all Go threads do.
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("spare helper: unshare CLONE_FS: %w", err)
	}
	if err := unix.Setns(agentMntFd, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("spare helper: enter the agent's mount namespace: %w", err)
	}
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("spare helper: a mount namespace of its own: %w", err)
	}
	return nil
}

// WarmJSON round-trips a config shaped like a create's through
// encoding/json once, so that a process snapshotted with a template (the
// spare, the agent) has the field caches of the spec's types built:
// building them is most of a cold process's first spec decode.
func WarmJSON() {
	u := uint32(0)
	i64 := int64(0)
	b := true
	spec := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{Args: []string{"sh"}, Env: []string{"PATH=/bin"}, Cwd: "/", User: specs.User{AdditionalGids: []uint32{0}, Umask: &u},
			Capabilities: &specs.LinuxCapabilities{Bounding: []string{"CAP_CHOWN"}, Effective: []string{"CAP_CHOWN"}, Permitted: []string{"CAP_CHOWN"}},
			Rlimits:      []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}}, ConsoleSize: &specs.Box{}, OOMScoreAdj: new(int)},
		Root:        &specs.Root{Path: "/rootfs"},
		Hostname:    "spare",
		Mounts:      []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid"}}},
		Annotations: map[string]string{"a": "b"},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}}, Devices: []specs.LinuxDevice{{Path: "/dev/x", Type: "c", FileMode: new(os.FileMode), UID: &u, GID: &u}},
			Resources: &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{{Allow: b, Access: "rwm", Major: &i64}},
				Memory: &specs.LinuxMemory{Limit: &i64}, CPU: &specs.LinuxCPU{Shares: new(uint64), Quota: &i64}, Pids: &specs.LinuxPids{Limit: &i64}},
			CgroupsPath: "/x", Sysctl: map[string]string{"a": "b"}, MaskedPaths: []string{"/proc/kcore"}, ReadonlyPaths: []string{"/proc/sys"},
			Seccomp: &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{}}}}},
		},
	}
	data, err := json.Marshal(InitConfig{Mode: ModeCreate, Rootfs: "/rootfs", Spec: spec, Process: spec.Process})
	if err != nil {
		return
	}
	var cfg InitConfig
	_ = json.NewDecoder(bytes.NewReader(data)).Decode(&cfg)
}
