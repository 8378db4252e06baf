// Package stdio connects a container process's standard streams as
// containerd names them (fifo paths, file:// and binary:// URIs) to the
// streams of the guest process (one connection per stream).
package stdio

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/fifo"
	"github.com/sirupsen/logrus"
)

// Config is the stdio of a process as containerd sends it in Create/Exec.
type Config struct {
	Stdin, Stdout, Stderr string
	Terminal              bool
}

// stdinGrace is how long CloseIO waits for the stdin copy to drain what the
// client already wrote before cutting it off.
const stdinGrace = time.Second

// stdinDrainTimeout bounds how long CloseStdin waits, after the half-close,
// for the guest to close its end of the stdin stream.
const stdinDrainTimeout = 2 * time.Second

// binaryStopTimeout bounds a logging binary's exit after its pipes closed.
const binaryStopTimeout = 12 * time.Second

// IO is the host side of one process's stdio.
type IO struct {
	cfg     Config
	stdin   io.ReadCloser  // host source (fifo), nil when none
	stdout  io.WriteCloser // host destinations, nil when none
	stderr  io.WriteCloser
	extra   []io.Closer // kept-open fifo read ends
	binary  *exec.Cmd
	outWG   sync.WaitGroup
	inDone  chan struct{}
	guestIn HalfCloser
	// drainOnce: CloseStdin waits for the guest's end of stdin once.
	drainOnce sync.Once
	closed    atomic.Bool
	log       *logrus.Entry

	// Re-attachment after a rollback (reattach.go); mu guards these and guestIn.
	mu        sync.Mutex
	held      bool             // a rollback is in progress: ended guest streams keep their host ends
	heldEnded []io.WriteCloser // host ends whose guest stream ended while held
	outGen    uint64           // counts the sets of guest output streams
	guestOut  []io.Closer      // the current guest output streams
	inGen     uint64           // counts the guest stdin streams
	inSwap    chan struct{}    // closed when guestIn is replaced or the hold released
}

// HalfCloser is a guest stream whose write side can be closed alone (EOF for
// the guest) — *net.UnixConn and the vsock conns are.
type HalfCloser interface {
	io.ReadWriteCloser
	CloseWrite() error
}

// Wants says which guest streams to request: stderr never with a terminal
// (the terminal carries both).
func (c Config) Wants() (stdin, stdout, stderr bool) {
	return c.Stdin != "", c.Stdout != "", c.Stderr != "" && !c.Terminal
}

// Open opens the host ends. id and ns are passed to a binary:// logger as
// CONTAINER_ID and CONTAINER_NAMESPACE.
func Open(ctx context.Context, id, ns string, c Config, log *logrus.Entry) (_ *IO, retErr error) {
	if log == nil {
		log = logrus.NewEntry(logrus.StandardLogger())
	}
	i := &IO{cfg: c, log: log}
	defer func() {
		if retErr != nil {
			i.Close()
		}
	}()
	if c.Stdout != "" || c.Stderr != "" {
		uri := c.Stdout
		if uri == "" {
			uri = c.Stderr
		}
		u, err := url.Parse(uri)
		if err != nil {
			return nil, fmt.Errorf("parse stdio uri %q: %w", uri, err)
		}
		switch u.Scheme {
		case "", "fifo":
			if err := i.openFifos(ctx); err != nil {
				return nil, err
			}
		case "file":
			if err := i.openFile(u.Path); err != nil {
				return nil, err
			}
		case "binary", "binary-v2":
			if err := i.startBinary(u, id, ns); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("stdio uri %q: unknown scheme %q (want a fifo path, file:// or binary://)", uri, u.Scheme)
		}
	}
	if c.Stdin != "" {
		// Non-blocking open: the client may not have opened its write end yet;
		// reads then wait for it.
		f, err := fifo.OpenFifo(context.Background(), c.Stdin, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return nil, fmt.Errorf("open stdin fifo %s: %w", c.Stdin, err)
		}
		i.stdin = f
	}
	return i, nil
}

func (i *IO) openFifos(ctx context.Context) error {
	open := func(path string) (io.WriteCloser, error) {
		if path == "" {
			return nil, nil
		}
		w, err := fifo.OpenFifo(ctx, path, syscall.O_WRONLY, 0)
		if err != nil {
			return nil, fmt.Errorf("open fifo %s for writing: %w", path, err)
		}
		// Holding a read end keeps writes from failing with EPIPE while the
		// client (say, ctr after a restart of containerd) reattaches.
		r, err := fifo.OpenFifo(ctx, path, syscall.O_RDONLY, 0)
		if err != nil {
			w.Close()
			return nil, fmt.Errorf("open fifo %s for reading: %w", path, err)
		}
		i.extra = append(i.extra, r)
		return w, nil
	}
	var err error
	if i.stdout, err = open(i.cfg.Stdout); err != nil {
		return err
	}
	if i.cfg.Terminal {
		return nil
	}
	i.stderr, err = open(i.cfg.Stderr)
	return err
}

func (i *IO) openFile(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("stdio file %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("stdio file: %w", err)
	}
	// Both streams go to the one file; it is closed after the second Close.
	shared := &sharedCloser{WriteCloser: f}
	shared.n.Store(2)
	i.stdout, i.stderr = shared, shared
	return nil
}

type sharedCloser struct {
	io.WriteCloser
	n atomic.Int32
}

func (s *sharedCloser) Close() error {
	if s.n.Add(-1) > 0 {
		return nil
	}
	return s.WriteCloser.Close()
}

// startBinary runs a logging binary the way containerd's runc shim does: it
// gets the stdout and stderr read ends as fds 3 and 4 and signals readiness
// by closing (binary-v2: writing a byte to, then closing) fd 5.
func (i *IO) startBinary(u *url.URL, id, ns string) error {
	outR, outW, err := os.Pipe()
	if err != nil {
		return err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return err
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		errR.Close()
		errW.Close()
		return err
	}
	var args []string
	for k, vs := range u.Query() {
		args = append(args, k)
		if len(vs) > 0 {
			args = append(args, vs[0])
		}
	}
	cmd := exec.Command(u.Path, args...)
	cmd.Env = append(cmd.Env, "CONTAINER_ID="+id, "CONTAINER_NAMESPACE="+ns)
	cmd.ExtraFiles = []*os.File{outR, errR, readyW}
	i.stdout, i.stderr = outW, errW
	startErr := cmd.Start()
	outR.Close()
	errR.Close()
	readyW.Close()
	defer readyR.Close()
	if startErr != nil {
		return fmt.Errorf("start logging binary %s: %w", u.Path, startErr)
	}
	i.binary = cmd
	b := make([]byte, 1)
	n, err := readyR.Read(b)
	if err != nil && err != io.EOF {
		return fmt.Errorf("logging binary %s: wait for ready: %w", u.Path, err)
	}
	if u.Scheme == "binary-v2" && n == 0 {
		return fmt.Errorf("logging binary %s did not signal ready (crashed or exited early)", u.Path)
	}
	return nil
}

// Attach starts copying between the host ends and the guest streams (nil
// for streams not requested). Output copies end when the guest closes its
// stream; WaitOutput waits for them.
func (i *IO) Attach(guestStdin HalfCloser, guestStdout, guestStderr io.ReadCloser) {
	pump := func(name string, dst io.WriteCloser, src io.ReadCloser) {
		if src == nil {
			if dst != nil {
				dst.Close()
			}
			return
		}
		i.pump(name, dst, src)
	}
	pump("stdout", i.stdout, guestStdout)
	if !i.cfg.Terminal {
		pump("stderr", i.stderr, guestStderr)
	} else if i.stderr != nil {
		i.stderr.Close()
	}
	i.mu.Lock()
	i.inSwap = make(chan struct{})
	if guestStdin != nil {
		i.guestIn = guestStdin
	}
	i.mu.Unlock()
	if guestStdin != nil && i.stdin != nil {
		i.inDone = make(chan struct{})
		go i.copyStdin()
	} else if guestStdin != nil {
		_ = guestStdin.CloseWrite()
	}
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// CloseStdin ends the process's stdin: it lets the copy drain what the
// client already wrote (bounded by a short grace), then cuts it and
// half-closes the guest stream.
func (i *IO) CloseStdin() {
	if i.inDone == nil {
		if i.stdin != nil {
			i.stdin.Close()
		}
		return
	}
	select {
	case <-i.inDone:
	case <-time.After(stdinGrace):
		i.stdin.Close()
		<-i.inDone
	}
	i.drainOnce.Do(i.waitGuestStdinClosed)
}

// waitGuestStdinClosed waits (bounded) until the guest closes its end of the
// stdin stream: the agent does so once it has passed everything the stream
// carried on to the process. Without this wait the caller's next step, the
// agent's CloseStdin RPC on another connection, can overtake data still in
// flight on the stream and close the process's stdin before it arrives (seen
// in the test host: `cat` fed one line exited with no output).
func (i *IO) waitGuestStdinClosed() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The guest never writes on a stdin stream: this returns at its close
		// (EOF) or when Close closes the stream.
		i.mu.Lock()
		g := i.guestIn
		i.mu.Unlock()
		_, _ = io.Copy(io.Discard, g)
	}()
	select {
	case <-done:
	case <-time.After(stdinDrainTimeout):
		i.log.Warn("the guest did not close its stdin stream after EOF; closing stdin anyway")
	}
}

// WaitOutput waits until stdout and stderr are copied to EOF or ctx ends.
func (i *IO) WaitOutput(ctx context.Context) error {
	done := make(chan struct{})
	go func() { i.outWG.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for process output: %w", ctx.Err())
	}
}

// Close releases every host end and stops a logging binary.
func (i *IO) Close() error {
	if i.closed.Swap(true) {
		return nil
	}
	var errs []error
	i.mu.Lock()
	guestIn := i.guestIn
	i.mu.Unlock()
	for _, c := range []io.Closer{i.stdin, i.stdout, i.stderr, guestIn} {
		if c != nil {
			if err := c.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
				errs = append(errs, err)
			}
		}
	}
	for _, c := range i.extra {
		c.Close()
	}
	if i.binary != nil {
		done := make(chan error, 1)
		go func() { done <- i.binary.Wait() }()
		select {
		case <-done:
		case <-time.After(binaryStopTimeout):
			_ = i.binary.Process.Kill()
			<-done
		}
	}
	return errors.Join(errs...)
}
