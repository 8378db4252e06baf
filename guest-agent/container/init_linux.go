package container

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/cube-runtime/cube/guest-agent/netif"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// MaybeRunInit runs the container helper and never returns if this process
// was started as one; otherwise it returns immediately.
func MaybeRunInit() {
	if len(os.Args) == 0 || os.Args[0] != InitArg0 {
		return
	}
	// Namespace and credential changes below are per thread until execve
	// makes this thread the whole process: never leave it.
	runtime.LockOSThread()
	entered := monotonicNS()
	status := os.NewFile(statusFd, "status")
	var err error
	if len(os.Args) > 1 && os.Args[1] == spareArg {
		err = runSpare(status, entered)
	} else {
		err = runInit(status, entered, false)
	}
	// Only reached on failure.
	kind := ""
	switch {
	case errors.Is(err, ErrInvalid):
		kind = "invalid"
	case errors.Is(err, ErrNotFound):
		kind = "notfound"
	}
	writeStatus(status, statusMsg{Stage: "error", Error: err.Error(), Kind: kind})
	os.Exit(127)
}

func writeStatus(w io.Writer, m statusMsg) {
	b, _ := json.Marshal(m)
	w.Write(append(b, '\n'))
}

// runInit sets the container up from the config on configFd, reports
// "ready" and execs on the go-ahead. loUp: lo is already up (a spare).
func runInit(status *os.File, entered int64, loUp bool) error {
	st := newStages(entered)
	unix.CloseOnExec(statusFd)
	unix.CloseOnExec(startFd)
	cfgFile := os.NewFile(configFd, "config")
	var cfg InitConfig
	if err := json.NewDecoder(io.LimitReader(cfgFile, 4*maxSpecBytes)).Decode(&cfg); err != nil {
		return fmt.Errorf("read init config: %w", err)
	}
	cfgFile.Close()
	if cfg.Process == nil {
		return invalidf("init config without process")
	}
	st.mark("config")

	if err := joinNamespaces(cfg.Join); err != nil {
		return err
	}
	st.mark("join")
	if cfg.Mode == ModeCreate && NewNetns(cfg.Spec) && !loUp {
		if err := loopbackUp(); err != nil {
			return err
		}
		loUp = true
		st.mark("lo")
	}
	if cfg.Mode == ModeCreate {
		if err := setupRootfs(cfg.Rootfs, cfg.Spec, st); err != nil {
			return err
		}
		if cfg.Spec.Hostname != "" {
			if err := unix.Sethostname([]byte(cfg.Spec.Hostname)); err != nil {
				return fmt.Errorf("sethostname %q: %w", cfg.Spec.Hostname, err)
			}
		}
		st.mark("hostname")
	}
	p := cfg.Process
	if p.Terminal {
		// Inside the container's mount namespace and root: the pty comes from its devpts.
		if err := setupConsole(); err != nil {
			return err
		}
	}
	for _, r := range p.Rlimits {
		lim := unix.Rlimit{Cur: r.Soft, Max: r.Hard}
		if err := unix.Setrlimit(rlimitResources[r.Type], &lim); err != nil {
			return fmt.Errorf("setrlimit %s: %w", r.Type, err)
		}
	}
	if p.OOMScoreAdj != nil {
		if err := os.WriteFile("/proc/self/oom_score_adj", []byte(fmt.Sprint(*p.OOMScoreAdj)), 0); err != nil {
			return fmt.Errorf("set oom_score_adj: %w", err)
		}
	}
	if p.NoNewPrivileges {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("set no_new_privs: %w", err)
		}
	}
	if p.User.Umask != nil {
		unix.Umask(int(*p.User.Umask) & 0o777)
	}
	// Credentials: groups first, uid last (after setuid we could no longer
	// change groups). syscall's setters apply to all threads.
	if err := capsBeforeSetuid(p.Capabilities); err != nil {
		return err
	}
	groups := make([]int, len(p.User.AdditionalGids))
	for i, g := range p.User.AdditionalGids {
		groups[i] = int(g)
	}
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("setgroups %v: %w", groups, err)
	}
	if err := syscall.Setgid(int(p.User.GID)); err != nil {
		return fmt.Errorf("setgid %d: %w", p.User.GID, err)
	}
	if err := syscall.Setuid(int(p.User.UID)); err != nil {
		return fmt.Errorf("setuid %d: %w", p.User.UID, err)
	}
	if err := capsAfterSetuid(p.Capabilities); err != nil {
		return err
	}
	if err := unix.Chdir(p.Cwd); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("%w: cwd %q does not exist in the container", ErrNotFound, p.Cwd)
		}
		return fmt.Errorf("chdir to cwd %q: %w", p.Cwd, err)
	}
	env := p.Env
	if !hasEnv(env, "PATH") {
		env = append(env, "PATH="+defaultPath)
	}
	if p.Terminal && !hasEnv(env, "TERM") {
		env = append(env, "TERM=xterm")
	}
	st.mark("process")
	bin, err := lookPath(p.Args[0], getEnv(env, "PATH"))
	if err != nil {
		return err
	}
	st.mark("path")

	writeStatus(status, statusMsg{Stage: "ready", RootSwitch: rootSwitch, LoopbackUp: loUp,
		EnteredNS: entered, StagesMS: st.String()})
	var b [1]byte
	if n, _ := os.NewFile(startFd, "start").Read(b[:]); n != 1 {
		// The agent dropped the process before starting it.
		os.Exit(0)
	}
	// The agent's coarse timer slack (inherited by this helper) is not the
	// container's: its process gets Linux's default back. Ordering: on
	// this thread (locked), right before the exec, which keeps it.
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, containerTimerSlack, 0, 0, 0); err != nil {
		return fmt.Errorf("reset timer slack: %w", err)
	}
	err = unix.Exec(bin, p.Args, env)
	return fmt.Errorf("exec %q: %w", bin, err)
}

// loopbackUp brings up lo: the kernel makes a new network namespace with lo
// down, and the container's programs expect 127.0.0.1 to answer. Joined
// namespaces (a pod's) were set up by whoever created them.
func loopbackUp() error {
	if _, err := netif.LoopbackUp(); err != nil {
		return fmt.Errorf("bring up lo in the container's new network namespace: %w", err)
	}
	return nil
}

// setupConsole opens a pty in the container's /dev/ptmx (the container's
// own devpts instance, so ttyname works there, as with runc), makes the
// slave stdin, stdout, stderr and controlling terminal, and sends the master
// to the agent on consoleFd.
func setupConsole() error {
	unix.CloseOnExec(consoleFd)
	master, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the container's /dev/ptmx (a terminal needs a devpts at /dev/pts): %w", err)
	}
	defer unix.Close(master)
	if err := unix.IoctlSetPointerInt(master, unix.TIOCSPTLCK, 0); err != nil {
		return fmt.Errorf("unlock pty: %w", err)
	}
	// TIOCGPTPEER opens the slave through the master's own devpts, whatever /dev/pts is.
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(master), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		return fmt.Errorf("open pty slave: %w", errno)
	}
	slave := int(r)
	for fd := 0; fd < 3; fd++ {
		if err := unix.Dup3(slave, fd, 0); err != nil {
			unix.Close(slave)
			return fmt.Errorf("pty slave as fd %d: %w", fd, err)
		}
	}
	unix.Close(slave)
	if err := unix.IoctlSetInt(0, unix.TIOCSCTTY, 0); err != nil {
		return fmt.Errorf("set controlling terminal: %w", err)
	}
	if err := unix.Sendmsg(consoleFd, []byte{0}, unix.UnixRights(master), nil, 0); err != nil {
		return fmt.Errorf("send the terminal to the agent: %w", err)
	}
	return unix.Close(consoleFd)
}

// containerTimerSlack is Linux's default timer slack (50 µs), which a
// container's process starts with whatever the agent's (initsys.AgentTimerSlack).
const containerTimerSlack = 50_000

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func hasEnv(env []string, key string) bool {
	_, ok := lookupEnv(env, key)
	return ok
}

func getEnv(env []string, key string) string {
	v, _ := lookupEnv(env, key)
	return v
}

func lookupEnv(env []string, key string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}

// lookPath finds the command like execvp would, with the process's own PATH,
// and says precisely why it cannot run.
func lookPath(cmd, pathEnv string) (string, error) {
	if strings.Contains(cmd, "/") {
		return cmd, checkExecutable(cmd)
	}
	var firstErr error
	for dir := range strings.SplitSeq(pathEnv, ":") {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, cmd)
		err := checkExecutable(p)
		if err == nil {
			return p, nil
		}
		if !errors.Is(err, ErrNotFound) && firstErr == nil {
			firstErr = err
		}
	}
	if firstErr != nil {
		return "", firstErr
	}
	return "", fmt.Errorf("%w: executable %q not found in PATH %q", ErrNotFound, cmd, pathEnv)
}

func checkExecutable(p string) error {
	st, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: executable %q does not exist", ErrNotFound, p)
	}
	if err != nil {
		return fmt.Errorf("stat executable %q: %w", p, err)
	}
	if st.IsDir() {
		return invalidf("%q is a directory, not an executable", p)
	}
	if !st.Mode().IsRegular() {
		return invalidf("%q is not a regular file", p)
	}
	if err := unix.Access(p, unix.X_OK); err != nil {
		return invalidf("%q is not executable (mode %v): %v", p, st.Mode().Perm(), err)
	}
	return nil
}

var nsSetnsFlag = map[specs.LinuxNamespaceType]int{
	specs.NetworkNamespace: unix.CLONE_NEWNET,
	specs.IPCNamespace:     unix.CLONE_NEWIPC,
	specs.UTSNamespace:     unix.CLONE_NEWUTS,
	specs.CgroupNamespace:  unix.CLONE_NEWCGROUP,
	specs.MountNamespace:   unix.CLONE_NEWNS,
}

// joinNamespaces enters namespaces on this (locked) thread. The mount
// namespace comes last: its paths are resolved in the current one.
func joinNamespaces(joins []NsJoin) error {
	var mnt *NsJoin
	for i := range joins {
		j := joins[i]
		if j.Type == specs.MountNamespace {
			mnt = &joins[i]
			continue
		}
		if err := setns(j); err != nil {
			return err
		}
	}
	if mnt != nil {
		// setns(CLONE_NEWNS) refuses a thread sharing its fs_struct with
		// other threads, which all Go threads do.
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			return fmt.Errorf("unshare CLONE_FS: %w", err)
		}
		if err := setns(*mnt); err != nil {
			return err
		}
	}
	return nil
}

func setns(j NsJoin) error {
	flag, ok := nsSetnsFlag[j.Type]
	if !ok {
		return invalidf("cannot join %s namespace", j.Type)
	}
	fd, err := unix.Open(j.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s namespace %s: %w", j.Type, j.Path, err)
	}
	defer unix.Close(fd)
	if err := unix.Setns(fd, flag); err != nil {
		return fmt.Errorf("setns %s namespace %s: %w", j.Type, j.Path, err)
	}
	return nil
}
