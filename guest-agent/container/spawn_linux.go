package container

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Starter forks a child through the agent's reaper: start returns the pid,
// the Starter registers it and returns a channel that receives its exit.
// (The reaper's Start fits; the type is generic to avoid an import.)
type Starter[E any] func(start func() (int, error)) (int, <-chan E, error)

// SpawnOptions describe one process to prepare.
type SpawnOptions struct {
	// Helper is the agent binary to re-execute; default /proc/self/exe.
	Helper string
	Mode   Mode
	// Spec (create) or Process (exec).
	Spec    *specs.Spec
	Process *specs.Process
	Rootfs  string
	// InitPid is the container's init pid; exec joins its namespaces.
	InitPid int
	// Stdio for the child: nil means /dev/null. With Terminal they are
	// ignored: the helper opens a pty inside the container (its own devpts,
	// so the terminal has a name there, as with runc), makes the slave its
	// stdio and controlling terminal, and hands the master back
	// (Prepared.Console).
	Stdin, Stdout, Stderr *os.File
	Terminal              bool
	// CgroupFD, when > 0, is a cgroup2 directory the child is forked into.
	CgroupFD int
}

// Prepared is a helper parked right before execve.
type Prepared[E any] struct {
	Pid int
	// RootSwitch is "pivot_root", "move+chroot" (weaker: / was an
	// initramfs) or "" (exec).
	RootSwitch string
	// LoopbackUp: the container got a network namespace of its own and the
	// helper brought its lo up (create only).
	LoopbackUp bool
	// Console is the pty master of a Terminal process (nil otherwise); the
	// caller owns it.
	Console *os.File
	// Timing: what the preparation took, for the caller's log ("fork=…
	// exec=… config=… rootfs=… ready=…", ms): fork is clone and execve as
	// seen by the caller, exec from there to the helper's main (the Go
	// runtime's start), then the helper's steps, ready the status back.
	Timing string
	Exited <-chan E
	start  *os.File
	status *bufio.Reader
	statF  *os.File
}

// Prepare forks the helper and waits until it has set everything up. On
// error nothing is left running (the helper exited by itself).
func Prepare[E any](o SpawnOptions, starter Starter[E]) (*Prepared[E], error) {
	cfg, cloneFlags, pidNs, err := initConfig(o)
	if err != nil {
		return nil, err
	}
	payload, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("encode init config: %w", err)
	}
	files, err := newHelperFiles()
	if err != nil {
		return nil, err
	}
	defer files.closeChild()
	var console *os.File // our end of the console socket
	if o.Terminal {
		var child *os.File
		if console, child, err = socketPair("console-socket"); err != nil {
			files.closeOurs()
			return nil, err
		}
		// Closed on return: the helper's pty master arrives on it before "ready".
		defer console.Close()
		files.child = append(files.child, child) // fd 6
	}
	helper := o.Helper
	if helper == "" {
		helper = "/proc/self/exe"
	}
	h := helperProc{path: helper, args: []string{InitArg0},
		stdio: [3]*os.File{files.orNull(o.Stdin), files.orNull(o.Stdout), files.orNull(o.Stderr)},
		extra: files.child, cloneFlags: cloneFlags, cgroupFD: o.CgroupFD}
	pid, exited, err := startIn(pidNs, &h, starter)
	if err != nil {
		files.closeOurs()
		return nil, err
	}
	p := &Prepared[E]{Pid: pid, Exited: exited, start: files.startW, statF: files.statR, status: bufio.NewReader(files.statR)}
	m, err := p.await(files.cfgW, payload, console)
	if err != nil {
		return nil, err
	}
	p.Timing = fmt.Sprintf("%s %s ready=%.1f", h.timing(m.EnteredNS), m.StagesMS, nsMS(monotonicNS()-h.forkNS))
	return p, nil
}

// initConfig is what the helper of o is told, how it is cloned, and the
// pid namespace it is forked in ("": ours or a new one).
func initConfig(o SpawnOptions) (cfg InitConfig, cloneFlags uintptr, pidNs string, err error) {
	cfg = InitConfig{Mode: o.Mode, Rootfs: o.Rootfs, Spec: o.Spec, Process: o.Process}
	switch o.Mode {
	case ModeCreate:
		if o.Spec == nil {
			return cfg, 0, "", invalidf("create without spec")
		}
		cfg.Process = o.Spec.Process
		cloneFlags = CloneFlags(o.Spec)
		for _, ns := range o.Spec.Linux.Namespaces {
			if ns.Path == "" {
				continue
			}
			if ns.Type == specs.PIDNamespace {
				pidNs = ns.Path
			} else {
				cfg.Join = append(cfg.Join, NsJoin{Type: ns.Type, Path: ns.Path})
			}
		}
	case ModeExec:
		if o.Process == nil || o.InitPid <= 0 {
			return cfg, 0, "", invalidf("exec without process or container pid")
		}
		if cfg.Join, pidNs, err = namespacesOf(o.InitPid); err != nil {
			return cfg, 0, "", err
		}
	default:
		return cfg, 0, "", invalidf("unknown mode %q", o.Mode)
	}
	return cfg, cloneFlags, pidNs, nil
}

// startIn starts h in the pid namespace pidNs ("": the caller's). Joining
// a pid namespace only affects children forked afterwards by the joining
// thread: the fork then happens on a dedicated locked thread that dies.
func startIn[E any](pidNs string, h *helperProc, starter Starter[E]) (pid int, exited <-chan E, err error) {
	if pidNs == "" {
		return startHelper(h, starter)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		fd, err := unix.Open(pidNs, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("open pid namespace %s: %w", pidNs, err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWPID); err != nil {
			errc <- fmt.Errorf("setns pid namespace %s: %w", pidNs, err)
			return
		}
		pid, exited, err = startHelper(h, starter)
		errc <- err
	}()
	return pid, exited, <-errc
}

// helperFiles are what a helper is forked with: its ends of the config,
// status and start pipes (fds 3, 4, 5; child, to which a caller appends
// what follows) and /dev/null for the stdio it is not given, and our ends
// of the pipes.
type helperFiles struct {
	child               []*os.File
	devNull             *os.File
	cfgW, statR, startW *os.File
}

func newHelperFiles() (*helperFiles, error) {
	var made []*os.File
	fail := func(err error) (*helperFiles, error) {
		for _, f := range made {
			f.Close()
		}
		return nil, err
	}
	var ends [6]*os.File
	for i := 0; i < 3; i++ {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(fmt.Errorf("pipe: %w", err))
		}
		made = append(made, r, w)
		ends[2*i], ends[2*i+1] = r, w
	}
	devNull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return fail(fmt.Errorf("open /dev/null: %w", err))
	}
	return &helperFiles{child: []*os.File{ends[0], ends[3], ends[4]}, devNull: devNull,
		cfgW: ends[1], statR: ends[2], startW: ends[5]}, nil
}

func (f *helperFiles) orNull(file *os.File) *os.File {
	if file == nil {
		return f.devNull
	}
	return file
}

// closeChild drops our copies of the helper's files (after the fork, or
// when there is none).
func (f *helperFiles) closeChild() {
	for _, c := range f.child {
		c.Close()
	}
	f.devNull.Close()
}

// closeOurs drops our ends of the pipes (the helper did not start).
func (f *helperFiles) closeOurs() {
	f.cfgW.Close()
	f.statR.Close()
	f.startW.Close()
}

// await sends the helper its config and waits until it is ready; console
// is our end of the console socket of a terminal process (nil otherwise).
// On error the helper is gone or killed.
func (p *Prepared[E]) await(cfgW *os.File, payload []byte, console *os.File) (*statusMsg, error) {
	// The spec can exceed a pipe buffer; the helper reads it concurrently.
	go func() {
		cfgW.Write(payload)
		cfgW.Close()
	}()
	m, err := p.readStatus()
	if err != nil {
		p.close()
		return nil, err
	}
	if m == nil || m.Stage != "ready" {
		p.close()
		return nil, fmt.Errorf("container helper exited before it was ready")
	}
	p.RootSwitch, p.LoopbackUp = m.RootSwitch, m.LoopbackUp
	if console != nil {
		// The helper sent the master before "ready": it is queued on the socket.
		if p.Console, err = recvConsole(console); err != nil {
			p.Abort()
			return nil, err
		}
	}
	return m, nil
}

// helperProc is one helper to fork: its binary, argv, stdio, the files
// after them (fd 3 on), and how it is cloned. forkNS and forkedNS time the
// fork (CLOCK_MONOTONIC), for the caller's timing.
type helperProc struct {
	path             string
	args             []string
	stdio            [3]*os.File
	extra            []*os.File
	cloneFlags       uintptr
	cgroupFD         int
	forkNS, forkedNS int64
}

// timing is the helper's start for a Timing string: "fork=… exec=…" (ms),
// the fork as seen by the caller, then to the helper's main at entered.
func (h *helperProc) timing(entered int64) string {
	return fmt.Sprintf("fork=%.1f exec=%.1f", nsMS(h.forkedNS-h.forkNS), nsMS(entered-h.forkedNS))
}

// startHelper forks and execs h through starter (the agent's reaper).
func startHelper[E any](h *helperProc, starter Starter[E]) (int, <-chan E, error) {
	cmd := &exec.Cmd{
		Path:       h.path,
		Args:       h.args,
		Env:        []string{},
		Stdin:      h.stdio[0],
		Stdout:     h.stdio[1],
		Stderr:     h.stdio[2],
		ExtraFiles: h.extra,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: h.cloneFlags,
			// A session leader without a terminal: the helper takes its pty as controlling terminal.
			Setsid:      true,
			UseCgroupFD: h.cgroupFD > 0,
			CgroupFD:    h.cgroupFD,
			// No Pdeathsig: it fires when the forking *thread* exits, which
			// the pid-namespace path in Prepare does on purpose.
		},
	}
	return starter(func() (int, error) {
		h.forkNS = monotonicNS()
		defer func() { h.forkedNS = monotonicNS() }()
		if err := cmd.Start(); err != nil {
			return 0, fmt.Errorf("start container helper: %w", err)
		}
		pid := cmd.Process.Pid
		cmd.Process.Release()
		return pid, nil
	})
}

// socketPair makes a SOCK_SEQPACKET pair: ours, and theirs for a helper.
func socketPair(name string) (ours, theirs *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("%s socketpair: %w", name, err)
	}
	return os.NewFile(uintptr(fds[0]), name), os.NewFile(uintptr(fds[1]), name+"-child"), nil
}

// recvFds receives one message on sock with the file descriptors it
// carries (room for max; close-on-exec). n is the message's length: 0
// when nothing was received, the peer having closed the socket (err nil)
// or the receive failing (err says why).
func recvFds(sock, max int) (n int, fds []int, err error) {
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(max*4))
	n, oobn, _, _, err := unix.Recvmsg(sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil || n <= 0 {
		return 0, nil, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return n, nil, err
	}
	if len(msgs) != 1 {
		return n, nil, fmt.Errorf("%d control messages, want 1", len(msgs))
	}
	fds, err = unix.ParseUnixRights(&msgs[0])
	return n, fds, err
}

// recvConsole receives the pty master the helper sent on the console socket.
func recvConsole(sock *os.File) (*os.File, error) {
	_, fds, err := recvFds(int(sock.Fd()), 1)
	if err != nil || len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("receive the container's terminal: want 1 file descriptor, got %d (%v)", len(fds), err)
	}
	// Non-blocking so the runtime poller serves reads and Close interrupts them.
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		return nil, fmt.Errorf("container terminal: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "/dev/ptmx"), nil
}

// readStatus returns the next status message, nil at EOF, or the helper's
// error as an error.
func (p *Prepared[E]) readStatus() (*statusMsg, error) {
	line, err := p.status.ReadBytes('\n')
	if len(line) == 0 && err != nil {
		return nil, nil
	}
	var m statusMsg
	if err := json.Unmarshal(line, &m); err != nil {
		return nil, fmt.Errorf("container helper status %q: %w", line, err)
	}
	if m.Stage == "error" {
		return nil, helperError(m)
	}
	return &m, nil
}

func helperError(m statusMsg) error {
	switch m.Kind {
	case "invalid":
		return fmt.Errorf("%w: %s", ErrInvalid, trimKind(m.Error, ErrInvalid))
	case "notfound":
		return fmt.Errorf("%w: %s", ErrNotFound, trimKind(m.Error, ErrNotFound))
	}
	return errors.New(m.Error)
}

func trimKind(s string, kind error) string {
	prefix := kind.Error() + ": "
	if len(s) >= len(prefix) && s[:len(prefix)] == prefix {
		return s[len(prefix):]
	}
	return s
}

// Start lets the helper execve and reports whether that succeeded.
func (p *Prepared[E]) Start() error {
	defer p.close()
	if _, err := p.start.Write([]byte{1}); err != nil {
		return fmt.Errorf("signal start: %w", err)
	}
	p.start.Close()
	// execve closes the status pipe (CLOEXEC): EOF means the command runs.
	_, err := p.readStatus()
	return err
}

// Abort drops a prepared process without running it.
func (p *Prepared[E]) Abort() {
	p.close()
	unix.Kill(p.Pid, unix.SIGKILL)
}

func (p *Prepared[E]) close() {
	p.start.Close()
	p.statF.Close()
}

// namespacesOf lists the namespaces of pid that differ from ours: those an
// exec must join. The pid namespace is returned apart.
func namespacesOf(pid int) (joins []NsJoin, pidNs string, err error) {
	for _, t := range []specs.LinuxNamespaceType{specs.IPCNamespace, specs.UTSNamespace, specs.NetworkNamespace, specs.CgroupNamespace, specs.PIDNamespace, specs.MountNamespace} {
		name := nsProcName[t]
		theirs := fmt.Sprintf("/proc/%d/ns/%s", pid, name)
		a, err := os.Readlink(theirs)
		if err != nil {
			return nil, "", fmt.Errorf("%w: namespaces of container process %d: %v", ErrNotFound, pid, err)
		}
		b, err := os.Readlink("/proc/self/ns/" + name)
		if err != nil {
			return nil, "", fmt.Errorf("read own %s namespace: %w", name, err)
		}
		if a == b {
			continue
		}
		if t == specs.PIDNamespace {
			pidNs = theirs
		} else {
			joins = append(joins, NsJoin{Type: t, Path: theirs})
		}
	}
	return joins, pidNs, nil
}

var nsProcName = map[specs.LinuxNamespaceType]string{
	specs.IPCNamespace: "ipc", specs.UTSNamespace: "uts", specs.NetworkNamespace: "net",
	specs.CgroupNamespace: "cgroup", specs.PIDNamespace: "pid", specs.MountNamespace: "mnt",
}
