package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/hypervisor/control"
	"github.com/cube-runtime/cube/hypervisor/vsockdial"
	"github.com/cube-runtime/cube/shim/standby"
)

// ProcessVMM runs the VM as a cube-vmm child process (cmd/cube-vmm) and
// drives it through its control socket with hypervisor/control's Client. The
// command line it builds (docs/shim.md, "cube-vmm contract"):
//
//	cube-vmm -kernel K [-initrd I] -cmdline C -memory M -vcpus N [-hugetlb]
//	  [-disk P,serial=S[,ro]]... [-net fd=N,mac=M]... -vsock U -vsock-cid CID
//	  -control S -console F -console-input none
//
// and, for a sandbox started from a template snapshot (machine shape, kernel and disks come from it):
//
//	cube-vmm restore -log-level info -control S -vsock U -console F -disk-dir D
//	  [-disk-use SLOT=STUB]... [-disk-set cube-slot-0=ROOTFS] TEMPLATE
type ProcessVMM struct {
	// Binary is the cube-vmm executable (path or name in PATH).
	Binary string
	// Cgroup, when set, is where the VMM process is placed right after it
	// starts (before the guest runs any workload).
	Cgroup string
	Log    *logrus.Entry

	mu      sync.Mutex
	cmd     *exec.Cmd
	cfg     VMConfig
	done    chan struct{}
	exit    VMExit
	started bool
	// tail keeps the end of cube-vmm's stderr: a refused restore says why there.
	tail *tailWriter
	// pid and pidfd of an adopted standby's cube-vmm (Adopt), which is not
	// this process's child: its end is seen through the pidfd.
	pid, pidfd int
}

// tailWriter keeps the last bytes written to it.
type tailWriter struct {
	mu  sync.Mutex
	buf []byte
}

const tailSize = 2048

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > tailSize {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-tailSize:]...)
	}
	return len(p), nil
}

// last is ": " and the last non-empty line written ("" when none).
func (t *tailWriter) last() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := strings.Split(strings.TrimSpace(string(t.buf)), "\n")
	if l := strings.TrimSpace(lines[len(lines)-1]); l != "" {
		return ": " + l
	}
	return ""
}

var (
	_ VMM     = (*ProcessVMM)(nil)
	_ Adopter = (*ProcessVMM)(nil)
)

// Args returns cube-vmm's arguments for cfg.
func Args(cfg VMConfig) []string {
	if cfg.Template != "" {
		// The template's writable disks get working copies beside the sandbox's other state.
		// -log-level info: its "restored and running" line times the
		// restore's steps (steps_ms, machine_steps_ms) in the shim's log.
		a := []string{"restore", "-log-level", "info", "-control", cfg.ControlPath, "-vsock", cfg.VsockPath,
			"-console", cfg.ConsolePath, "-disk-dir", filepath.Dir(cfg.ControlPath)}
		a = append(a, diskFlags("-disk-path", cfg.DiskPaths)...)
		a = append(a, diskFlags("-disk-use", cfg.DiskUses)...)
		a = append(a, diskFlags("-disk-set", cfg.DiskSets)...)
		// The snapshot's own MACs stay (cube-vmm refuses another): the
		// agent gives the guest interfaces their new ones.
		nets := make([]NIC, len(cfg.Nets))
		for i, n := range cfg.Nets {
			nets[i] = NIC{Tap: n.Tap}
		}
		a = append(a, netArgs(nets)...)
		for _, sh := range cfg.Shares {
			a = append(a, "-fs-path", sh.Tag+"="+sh.Path)
		}
		return append(a, cfg.Template)
	}
	a := []string{
		"-kernel", cfg.Kernel,
		"-cmdline", cfg.Cmdline,
		"-memory", strconv.FormatUint(uint64(cfg.MemoryMiB), 10),
		"-vcpus", strconv.FormatUint(uint64(cfg.VCPUs), 10),
	}
	if cfg.Initrd != "" {
		a = append(a, "-initrd", cfg.Initrd)
	}
	if cfg.HugeTLB {
		a = append(a, "-hugetlb")
	}
	for _, d := range cfg.Disks {
		v := d.Path + ",serial=" + d.Serial
		if d.ReadOnly {
			v += ",ro"
		}
		a = append(a, "-disk", v)
	}
	for _, sh := range cfg.Shares {
		a = append(a, "-fs", "tag="+sh.Tag+",path="+sh.Path)
	}
	a = append(a, netArgs(cfg.Nets)...)
	a = append(a,
		"-vsock", cfg.VsockPath,
		"-vsock-cid", strconv.FormatUint(uint64(cfg.GuestCID), 10),
		"-control", cfg.ControlPath,
		"-console", cfg.ConsolePath,
		"-console-input", "none",
	)
	return a
}

// diskFlags is flag SERIAL=PATH for each entry of paths, by serial.
func diskFlags(flag string, paths map[string]string) []string {
	serials := make([]string, 0, len(paths))
	for s := range paths {
		serials = append(serials, s)
	}
	sort.Strings(serials)
	var a []string
	for _, s := range serials {
		a = append(a, flag, s+"="+paths[s])
	}
	return a
}

func validateDisk(d Disk) error {
	if len(d.Serial) == 0 || len(d.Serial) > 20 {
		return fmt.Errorf("disk serial %q must be 1..20 bytes", d.Serial)
	}
	// Commas and newlines would break the --disk value and control lines.
	if strings.ContainsAny(d.Path, ",\n ") || strings.ContainsAny(d.Serial, ",=\n ") {
		return fmt.Errorf("disk %q (%s): path or serial contains a comma, space or newline", d.Serial, d.Path)
	}
	return nil
}

// Start launches cube-vmm and returns once its vsock and control sockets
// exist (the guest may still be booting), or with an error if the VMM died
// first or ctx ended.
func (v *ProcessVMM) Start(ctx context.Context, cfg VMConfig) error {
	v.mu.Lock()
	if v.started {
		v.mu.Unlock()
		return errors.New("vmm already started")
	}
	v.started = true
	v.mu.Unlock()
	for _, d := range cfg.Disks {
		if err := validateDisk(d); err != nil {
			return err
		}
	}
	if len(cfg.Nets) > 0 && cfg.Template != "" && !cfg.ReplaceNets {
		return fmt.Errorf("a template restore cannot add net devices: %w", errdefs.ErrInvalidArgument)
	}
	for i, n := range cfg.Nets {
		if err := validateNIC(i, n); err != nil {
			return err
		}
	}
	if v.Log == nil {
		v.Log = logrus.NewEntry(logrus.StandardLogger())
	}
	bin, err := exec.LookPath(v.Binary)
	if err != nil {
		return fmt.Errorf("find vmm binary: %w", err)
	}
	cmd := exec.Command(bin, Args(cfg)...)
	// Own process group: signals meant for the shim's group must not reach
	// the VM. Not Pdeathsig: it fires when the forking *thread* exits, which
	// Go does not control; a crashed shim's VMM is reaped by the delete action.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	logw := v.Log.WithField("vmm", bin).WriterLevel(logrus.InfoLevel)
	v.tail = &tailWriter{}
	cmd.Stdout, cmd.Stderr = logw, io.MultiWriter(logw, v.tail)
	for _, n := range cfg.Nets {
		cmd.ExtraFiles = append(cmd.ExtraFiles, n.Tap) // fd 3+i: netArgs
	}
	if err := cmd.Start(); err != nil {
		logw.Close()
		return fmt.Errorf("start %s: %w", bin, err)
	}
	v.mu.Lock()
	v.cmd, v.cfg, v.done = cmd, cfg, make(chan struct{})
	v.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logw.Close()
		v.mu.Lock()
		v.exit = exitOf(cmd.ProcessState, err)
		v.mu.Unlock()
		close(v.done)
	}()
	// Placement precedes the guest's first workload: the agent runs nothing
	// until we call it, and we do not before Start returns.
	if v.Cgroup != "" {
		if err := PlaceInCgroup(v.Cgroup, cmd.Process.Pid); err != nil {
			v.kill()
			return fmt.Errorf("place vmm pid %d in cgroup %s: %w", cmd.Process.Pid, v.Cgroup, err)
		}
	}
	switch err := waitFiles(ctx, v.done, cfg.VsockPath, cfg.ControlPath); {
	case errors.Is(err, errVMMExited):
		return fmt.Errorf("vmm exited before creating its sockets: %s%s", v.Exit().describe(), v.tail.last())
	case err != nil:
		v.kill()
		return fmt.Errorf("wait for vmm sockets: %w", err)
	}
	return nil
}

func (e VMExit) describe() string {
	if e.Err != nil {
		return fmt.Sprintf("status %d (%v)", e.Status, e.Err)
	}
	return fmt.Sprintf("status %d", e.Status)
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// exitOf maps a process state to a shell-style status: 128+signal if killed.
func exitOf(ps *os.ProcessState, err error) VMExit {
	if ps == nil {
		return VMExit{Status: 255, Err: err}
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return VMExit{Status: 128 + int(ws.Signal()), Err: fmt.Errorf("vmm killed by signal %d (%v)", int(ws.Signal()), ws.Signal())}
	}
	if ps.ExitCode() != 0 {
		return VMExit{Status: ps.ExitCode(), Err: fmt.Errorf("vmm exited with status %d", ps.ExitCode())}
	}
	return VMExit{}
}

func (v *ProcessVMM) kill() {
	v.mu.Lock()
	cmd, done := v.cmd, v.done
	if cmd == nil && v.pidfd > 0 {
		// Through the pidfd (the adopted pid cannot have been reused),
		// under v.mu: watchAdopted closes it under v.mu too.
		_ = unix.PidfdSendSignal(v.pidfd, unix.SIGKILL, nil, 0)
		v.mu.Unlock()
		<-done
		return
	}
	v.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Kill()
		<-v.done
	}
}

// Pid implements VMM.
func (v *ProcessVMM) Pid() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cmd == nil || v.cmd.Process == nil {
		return v.pid
	}
	return v.cmd.Process.Pid
}

// Wait implements VMM.
func (v *ProcessVMM) Wait() <-chan struct{} {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.done
}

// Exit implements VMM.
func (v *ProcessVMM) Exit() VMExit {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.exit
}

// Pause implements VMM.
func (v *ProcessVMM) Pause(ctx context.Context) error {
	return v.control(ctx, func(c *control.Client) error { return c.Pause(ctx) })
}

// Resume implements VMM.
func (v *ProcessVMM) Resume(ctx context.Context) error {
	return v.control(ctx, func(c *control.Client) error { return c.Resume(ctx) })
}

// SetDisk implements VMM with the control op "disk-set" (serial, path,
// read_only).
func (v *ProcessVMM) SetDisk(ctx context.Context, serial, path string, readOnly bool) error {
	if err := validateDisk(Disk{Serial: serial, Path: path}); err != nil {
		return err
	}
	return v.control(ctx, func(c *control.Client) error {
		set := c.SetDisk
		if readOnly {
			set = c.SetDiskReadOnly
		}
		_, err := set(ctx, serial, path)
		return err
	})
}

// Stop implements VMM: "stop" on the control socket, SIGKILL if the VMM is
// still there when ctx ends (or the request fails).
func (v *ProcessVMM) Stop(ctx context.Context) error {
	done := v.Wait()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	if err := v.control(ctx, func(c *control.Client) error { return c.Stop(ctx) }); err != nil {
		// cube-vmm may exit before its reply is out (EOF): give it a moment.
		select {
		case <-done:
			return nil
		case <-time.After(2 * time.Second):
		}
		v.Log.WithError(err).Warn("graceful vmm stop failed; killing it")
		v.kill()
		return nil
	}
	select {
	case <-done:
	case <-ctx.Done():
		v.Log.Warn("vmm did not stop in time; killing it")
		v.kill()
	}
	return nil
}

// DialVsock implements VMM.
func (v *ProcessVMM) DialVsock(ctx context.Context, port uint32) (net.Conn, error) {
	v.mu.Lock()
	path := v.cfg.VsockPath
	v.mu.Unlock()
	return vsockdial.Dial(ctx, path, port)
}

// Snapshot implements VMM with the control op "snapshot" (cube-vmm refuses
// a dir that is not absolute, and an incremental one without a parent beside it).
func (v *ProcessVMM) Snapshot(ctx context.Context, dir string, incremental bool) (control.SnapshotResult, error) {
	var res control.SnapshotResult
	err := v.control(ctx, func(c *control.Client) (err error) {
		res, err = c.Snapshot(ctx, dir, incremental)
		return err
	})
	return res, err
}

// Rollback implements VMM with the control op "rollback".
func (v *ProcessVMM) Rollback(ctx context.Context, dir string) (control.RollbackResult, error) {
	var res control.RollbackResult
	err := v.control(ctx, func(c *control.Client) (err error) {
		res, err = c.Rollback(ctx, dir)
		return err
	})
	return res, err
}

// control runs do on a connection to cube-vmm's control socket made for it:
// one per request, so that a request cut short by its ctx leaves nothing
// behind for the next.
func (v *ProcessVMM) control(ctx context.Context, do func(*control.Client) error) error {
	v.mu.Lock()
	path := v.cfg.ControlPath
	v.mu.Unlock()
	if path == "" {
		return errors.New("vmm not started")
	}
	c, err := control.Dial(ctx, path)
	if err != nil {
		return err
	}
	defer c.Close()
	return do(c)
}

// VMMBinary implements Adopter: the cube-vmm a standby is started with.
func (v *ProcessVMM) VMMBinary() string { return v.Binary }

// Adopt implements Adopter: the standby's cube-vmm, started by another
// shim, becomes this VMM. Its threads go back to normal scheduling and into
// v.Cgroup, then Adopt waits for its sockets (a standby may still be
// restoring). Its exit status cannot be known here (it is not our child):
// Exit reports 137 and the end of its log (vmm.log in its directory).
func (v *ProcessVMM) Adopt(ctx context.Context, cfg VMConfig, sb standby.Standby) (err error) {
	v.mu.Lock()
	if v.started {
		v.mu.Unlock()
		return errors.New("vmm already started")
	}
	v.mu.Unlock()
	if v.Log == nil {
		v.Log = logrus.NewEntry(logrus.StandardLogger())
	}
	pid := sb.Record.Pid
	fd, err := standby.Open(pid, sb.Record.StartTime)
	if err != nil {
		return err
	}
	if err := standby.Normalize(pid); err != nil {
		unix.Close(fd)
		return err
	}
	if v.Cgroup != "" {
		if err := PlaceInCgroup(v.Cgroup, pid); err != nil {
			unix.Close(fd)
			return fmt.Errorf("place vmm pid %d in cgroup %s: %w", pid, v.Cgroup, err)
		}
	}
	done := make(chan struct{})
	v.mu.Lock()
	v.started, v.pid, v.pidfd, v.cfg, v.done, v.tail = true, pid, fd, cfg, done, &tailWriter{}
	v.mu.Unlock()
	go v.watchAdopted(fd, filepath.Join(sb.Dir, standby.LogName), done)
	if err := waitFiles(ctx, done, cfg.VsockPath, cfg.ControlPath); err != nil {
		if !errors.Is(err, errVMMExited) {
			v.kill()
		}
		err = fmt.Errorf("adopted standby vmm: %w%s", err, v.tail.last())
		// Nothing of the standby stays: Start may run instead.
		v.mu.Lock()
		v.started, v.pid, v.pidfd, v.cfg, v.done, v.exit = false, 0, 0, VMConfig{}, nil, VMExit{}
		v.mu.Unlock()
		return err
	}
	return nil
}

// watchAdopted waits for the adopted VMM's end through its pidfd.
func (v *ProcessVMM) watchAdopted(fd int, logPath string, done chan struct{}) {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds, -1)
		if err == nil || !errors.Is(err, unix.EINTR) {
			break
		}
	}
	// Its last words, as the pipe of a child VMM gives them (tail.last).
	if lines, err := ConsoleTail(logPath, 20); err == nil {
		_, _ = v.tail.Write([]byte(strings.Join(lines, "\n")))
	}
	v.mu.Lock()
	v.exit = VMExit{Status: 128 + int(unix.SIGKILL), Err: fmt.Errorf("adopted standby vmm exited (its status is not known here; its log: %s)", logPath)}
	v.pidfd = -1
	unix.Close(fd)
	v.mu.Unlock()
	close(done)
}
