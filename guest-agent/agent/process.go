package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/cube-runtime/cube/guest-agent/container"
	"github.com/cube-runtime/cube/guest-agent/initsys"
	"github.com/cube-runtime/cube/guest-agent/protocol"
	"golang.org/x/sys/unix"
)

// procState is a process's lifecycle: created → running → stopped. A
// process that fails to start goes straight from created to stopped.
type procState int

const (
	stateCreated procState = iota
	stateRunning
	stateStopped
)

func (s procState) String() string {
	switch s {
	case stateCreated:
		return "created"
	case stateRunning:
		return "running"
	case stateStopped:
		return "stopped"
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// process is a container's init (execID "") or an exec'd process.
type process struct {
	containerID, execID string
	pid                 int
	terminal            bool
	consoleSize         *[2]uint16 // width, height for the terminal once prepared
	rootSwitch          string
	newNetnsLoUp        bool // create: a network namespace of its own, its lo brought up

	mu       sync.Mutex
	state    procState
	prepared *container.Prepared[initsys.Exit]
	exit     initsys.Exit
	done     chan struct{} // closed when the process has exited

	// Agent-side stdio ends. With a terminal, pty is the master and carries
	// stdin and stdout.
	pty      *os.File
	stdinW   *os.File
	stdoutR  *os.File
	stderrR  *os.File
	wanted   map[protocol.Stream]bool
	attached map[protocol.Stream]*attachment // the stream's current connection (streams.go)
	// streamsClosed: Delete closed the streams; nothing attaches any more.
	streamsClosed bool
	// stdinCopied is closed when an attached stdin stream has been copied to its end (see closeStdin).
	stdinCopied chan struct{}
}

// stdinDrain bounds how long CloseStdin waits for an attached stdin stream to deliver what the host sent
// before its EOF. The RPC and the stream travel on different vsock connections, so the RPC can overtake the
// last bytes; closing at once would drop them.
const stdinDrain = 2 * time.Second

func (p *process) name() string {
	if p.execID == "" {
		return fmt.Sprintf("container %q", p.containerID)
	}
	return fmt.Sprintf("exec %q of container %q", p.execID, p.containerID)
}

// stdioFiles creates the pipes or the pty for a new process and returns the
// child's ends (to close after the fork).
func (p *process) setupStdio(stdio *protocol.Stdio, terminal bool, size *[2]uint16) (child [3]*os.File, err error) {
	if stdio == nil {
		stdio = &protocol.Stdio{}
	}
	p.wanted = map[protocol.Stream]bool{protocol.Stdin: stdio.Stdin, protocol.Stdout: stdio.Stdout, protocol.Stderr: stdio.Stderr}
	p.attached = map[protocol.Stream]*attachment{}
	p.terminal = terminal
	fail := func(e error) ([3]*os.File, error) {
		for _, f := range child {
			if f != nil {
				f.Close()
			}
		}
		p.closeStdio()
		return [3]*os.File{}, e
	}
	if terminal {
		if stdio.Stderr {
			return fail(errInvalid("%s: stderr is not available with a terminal (it is merged into stdout)", p.name()))
		}
		// The container helper opens the pty inside the container; prepare takes its master (p.pty).
		p.consoleSize = size
		return child, nil
	}
	if stdio.Stdin {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(fmt.Errorf("stdin pipe: %w", err))
		}
		child[0], p.stdinW = r, w
	}
	if stdio.Stdout {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(fmt.Errorf("stdout pipe: %w", err))
		}
		child[1], p.stdoutR = w, r
	}
	if stdio.Stderr {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(fmt.Errorf("stderr pipe: %w", err))
		}
		child[2], p.stderrR = w, r
	}
	return child, nil
}

func closeChild(child [3]*os.File) {
	seen := map[*os.File]bool{}
	for _, f := range child {
		if f != nil && !seen[f] {
			seen[f] = true
			f.Close()
		}
	}
}

func (p *process) closeStdio() {
	for _, f := range []*os.File{p.pty, p.stdinW, p.stdoutR, p.stderrR} {
		if f != nil {
			f.Close()
		}
	}
	p.closeStreams()
}

// watch records the exit when the reaper reports it.
func (p *process) watch(exited <-chan initsys.Exit) {
	e := <-exited
	p.mu.Lock()
	p.exit = e
	p.state = stateStopped
	p.mu.Unlock()
	close(p.done)
}

func (p *process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != stateCreated || p.prepared == nil {
		return errState("%s is %s, not created", p.name(), p.state)
	}
	prep := p.prepared
	p.prepared = nil
	if err := prep.Start(); err != nil {
		return toStatus(err, "start %s", p.name())
	}
	// The exit may already have been recorded by watch (fast command).
	if p.state == stateCreated {
		p.state = stateRunning
	}
	return nil
}

func (p *process) status() (procState, initsys.Exit) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state, p.exit
}

func (p *process) wait(ctx context.Context) (initsys.Exit, error) {
	select {
	case <-p.done:
		_, e := p.status()
		return e, nil
	case <-ctx.Done():
		return initsys.Exit{}, toStatus(ctx.Err(), "wait for %s", p.name())
	}
}

func (p *process) signal(sig unix.Signal) error {
	st, _ := p.status()
	if st == stateStopped {
		return errNotFound("%s: process %d has already exited", p.name(), p.pid)
	}
	// The pid cannot have been reused: it is ours until the reaper collects
	// it, and then the state is stopped. The narrow window between reap and
	// state change is why ESRCH is reported, not ignored.
	if err := unix.Kill(p.pid, sig); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return errNotFound("%s: process %d has already exited", p.name(), p.pid)
		}
		return toStatus(err, "signal %d to %s", sig, p.name())
	}
	return nil
}

func (p *process) closeStdin(ctx context.Context) error {
	p.mu.Lock()
	copied := p.stdinCopied
	p.mu.Unlock()
	if copied != nil {
		// The host half-closes the stream before it calls CloseStdin: wait for that EOF to arrive here.
		select {
		case <-copied:
		case <-time.After(stdinDrain):
		case <-ctx.Done():
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.terminal {
		if p.pty == nil {
			return nil
		}
		// ^D: end of input for a terminal in canonical mode.
		_, err := p.pty.Write([]byte{4})
		return toStatus(err, "close terminal input of %s", p.name())
	}
	if p.stdinW == nil {
		if !p.wanted[protocol.Stdin] {
			return errState("%s was created without stdin", p.name())
		}
		return nil
	}
	err := p.stdinW.Close()
	p.stdinW = nil
	return toStatus(err, "close stdin of %s", p.name())
}

func (p *process) resize(w, h uint32) error {
	if !p.terminal || p.pty == nil {
		return errState("%s has no terminal", p.name())
	}
	if w == 0 || h == 0 || w > 0xffff || h > 0xffff {
		return errInvalid("terminal size %dx%d out of range", w, h)
	}
	err := unix.IoctlSetWinsize(int(p.pty.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Col: uint16(w), Row: uint16(h)})
	return toStatus(err, "resize terminal of %s", p.name())
}

func exitTime(e initsys.Exit) int64 {
	if e.At.IsZero() {
		return 0
	}
	return e.At.UnixNano()
}
