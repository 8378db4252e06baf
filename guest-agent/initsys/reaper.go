package initsys

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// Exit is how a child process ended.
type Exit struct {
	Pid    int
	Status unix.WaitStatus
	At     time.Time
}

// Code is the exit status in shell convention: the exit code, or 128+signal.
func (e Exit) Code() uint32 {
	if e.Status.Signaled() {
		return 128 + uint32(e.Status.Signal())
	}
	return uint32(e.Status.ExitStatus())
}

// Reaper collects every child (and, as PID 1 or a subreaper, every orphan)
// with wait4(-1) and hands exits of started processes to their waiters.
// Nothing else in the process may wait for children: the reaper would steal
// their status. Start and reaping hold the same lock, so an exit can never be
// reaped between fork and registration.
type Reaper struct {
	mu      sync.Mutex
	waiters map[int]chan Exit
	log     logrus.FieldLogger
	sig     chan os.Signal
}

// NewReaper makes the calling process a child subreaper (a no-op for PID 1)
// so orphans of our children come back to us.
func NewReaper(log logrus.FieldLogger) (*Reaper, error) {
	if os.Getpid() != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return nil, fmt.Errorf("set child subreaper: %w", err)
		}
	}
	r := &Reaper{waiters: map[int]chan Exit{}, log: log, sig: make(chan os.Signal, 1)}
	// Subscribe before any child starts so no SIGCHLD is missed.
	signal.Notify(r.sig, unix.SIGCHLD)
	return r, nil
}

// Run reaps until ctx ends.
func (r *Reaper) Run(ctx context.Context) {
	defer signal.Stop(r.sig)
	// A slow tick backs up SIGCHLD, which coalesces and could in theory be
	// lost between Notify and the first wait.
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		r.reap()
		select {
		case <-ctx.Done():
			return
		case <-r.sig:
		case <-t.C:
		}
	}
}

func (r *Reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		e := Exit{Pid: pid, Status: ws, At: time.Now()}
		if ch, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			ch <- e
			close(ch)
			continue
		}
		r.log.WithFields(logrus.Fields{"pid": pid, "status": e.Code()}).Debug("reaped orphan")
	}
}

// Start runs start (which forks a child and returns its pid) and registers
// the child; the returned channel receives its exit exactly once.
func (r *Reaper) Start(start func() (int, error)) (int, <-chan Exit, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := start()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan Exit, 1)
	r.waiters[pid] = ch
	return pid, ch, nil
}
