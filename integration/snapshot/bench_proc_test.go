package snapshot

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cube-runtime/cube/integration/benchloss"
)

// proc is a VMM process: console lines collected, stdin writable, killed with its group at the end.
type proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	mu    sync.Mutex
	lines []string
	errb  bytes.Buffer
	done  chan struct{}
	reset int // the exit status by which this VMM says its guest reset (benchloss.CubeVMMReset, QEMUReset)
}

// startProcErr starts a VMM process; the caller kills it.
func startProcErr(name string, args ...string) (*proc, error) {
	return startProcEnv(nil, name, args...)
}

// startProcEnv is startProcErr with env added to the process's environment.
func startProcEnv(env []string, name string, args ...string) (*proc, error) {
	p := &proc{cmd: exec.Command(name, args...), done: make(chan struct{}), reset: benchloss.CubeVMMReset}
	if strings.HasPrefix(filepath.Base(name), "qemu-system") {
		p.reset = benchloss.QEMUReset // qemuArgs has -no-reboot
	}
	if env != nil {
		p.cmd.Env = append(os.Environ(), env...)
	}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.cmd.Stderr = &lockedBuf{mu: &p.mu, b: &p.errb}
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, strings.TrimRight(sc.Text(), "\r"))
			p.mu.Unlock()
		}
		p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

type lockedBuf struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (l *lockedBuf) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(b)
}

func (p *proc) kill() {
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

func (p *proc) tail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.lines[max(0, len(p.lines)-20):]
	return strings.Join(l, "\n") + "\nstderr:\n" + lastN(p.errb.String(), 2000)
}

func lastN(s string, n int) string { return s[max(0, len(s)-n):] }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) waitExit(timeout time.Duration) error {
	select {
	case <-p.done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("%s did not exit in %v", p.cmd.Path, timeout)
	}
}

// ended classifies err, a failure of an operation on p: if p exited meanwhile (within a few seconds: a VMM
// that triple-faults closes its sockets just before it exits), its exit status says whether the VM was lost
// (benchloss.Exited); a VMM still running gave a real error.
func (p *proc) ended(err error) error {
	if err == nil {
		return nil
	}
	if p.waitExit(5*time.Second) != nil {
		return err
	}
	return benchloss.Exited(p.cmd.ProcessState, p.reset, fmt.Errorf("%w\n%s exited (%v):\n%s", err, filepath.Base(p.cmd.Path), p.cmd.ProcessState, p.tail()))
}

// waitLineErr waits for a console line starting with prefix. A VMM that exits first fails it (a lost VM if
// its status says the guest reset), and so does the timeout (a stall: a lost VM), with the evidence.
func (p *proc) waitLineErr(prefix string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	seen := 0
	for {
		p.mu.Lock()
		for ; seen < len(p.lines); seen++ {
			if l := p.lines[seen]; strings.HasPrefix(l, prefix) {
				p.mu.Unlock()
				return l, nil
			}
		}
		p.mu.Unlock()
		if p.exited() {
			return "", benchloss.Exited(p.cmd.ProcessState, p.reset, fmt.Errorf("%s exited (%v) before %q:\n%s\ntest host kernel log:\n%s",
				p.cmd.Path, p.cmd.ProcessState, prefix, p.tail(), bounded(kernelLog)))
		}
		if time.Now().After(deadline) {
			return "", benchloss.Stalled(fmt.Errorf("no %q from %s in %v:\n%s\nthreads:\n%s\ntest host kernel log:\n%s", prefix, p.cmd.Path, timeout, p.tail(),
				bounded(func() string { return threadStacks(p.cmd.Process.Pid) }), bounded(kernelLog)))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// errNoAnswer is within's timeout: the VMM (or its guest) stalled.
var errNoAnswer = errors.New("no answer")

// within runs f for at most timeout (f goes on in the background after it); a timeout is a stall, a lost VM.
func within(timeout time.Duration, f func() error) error {
	c := make(chan error, 1)
	go func() { c <- f() }()
	select {
	case err := <-c:
		return err
	case <-time.After(timeout):
		return benchloss.Stalled(fmt.Errorf("%w in %v", errNoAnswer, timeout))
	}
}

// memAvailable is the test host's MemAvailable and Shmem (tmpfs: the snapshots) from /proc/meminfo.
func memAvailable() string {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "MemAvailable:") || strings.HasPrefix(l, "Shmem:") {
			out = append(out, strings.Join(strings.Fields(l), " "))
		}
	}
	return strings.Join(out, ", ")
}

// bounded runs f for at most 10 s (a /proc read of a process stuck in the kernel may block).
func bounded(f func() string) string {
	c := make(chan string, 1)
	go func() { c <- f() }()
	select {
	case s := <-c:
		return s
	case <-time.After(10 * time.Second):
		return "(blocked for 10 s)"
	}
}

// threadStacks describes each thread of pid: state, kernel wait channel and kernel stack.
func threadStacks(pid int) string {
	var b strings.Builder
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return err.Error()
	}
	for _, t := range tasks {
		stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
		wchan, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/wchan", pid, t.Name()))
		stack, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stack", pid, t.Name()))
		state := "?"
		if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) {
			state = string(stat[i+2])
		}
		fmt.Fprintf(&b, "thread %s state %s wchan %s\n%s", t.Name(), state, wchan, stack)
	}
	return b.String()
}

// kernelLog returns the test host kernel's messages about KVM, the OOM killer and faults.
func kernelLog() string {
	// Raw syscalls: an os.File would hand the non-blocking descriptor to the Go poller, whose Read waits for
	// the next record instead of returning EAGAIN at the end of the log.
	fd, err := syscall.Open("/dev/kmsg", syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Sprintf("(kernel log: %v)", err)
	}
	defer syscall.Close(fd)
	var out []string
	buf := make([]byte, 8192)
	for {
		n, err := syscall.Read(fd, buf)
		if errors.Is(err, syscall.EPIPE) {
			continue // records were overwritten while reading
		}
		if err != nil || n <= 0 {
			break
		}
		l := string(buf[:n])
		if i := strings.IndexByte(l, ';'); i >= 0 {
			l = l[i+1:]
		}
		for _, w := range []string{"kvm", "oom", "Out of memory", "Killed process", "segfault", "BUG", "WARNING", "Call Trace"} {
			if strings.Contains(l, w) {
				out = append(out, strings.TrimSpace(l))
				break
			}
		}
	}
	return lastN(strings.Join(out, "\n"), 4000)
}
