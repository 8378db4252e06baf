package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// waitRecheck is how often waitFiles looks again without an event (events
// can be missed: a watch that could not be added, an overflowed queue).
const waitRecheck = 100 * time.Millisecond

// errVMMExited is waitFiles' error when done closed first.
var errVMMExited = errors.New("the process exited first")

// waitFiles returns nil once every one of paths exists, errVMMExited when
// done closes first, or ctx's error. It sleeps on inotify events in the
// paths' directories, re-checking every waitRecheck, instead of polling:
// ten shims stat'ing their VMM's sockets every 5 ms took nearly all of a
// 1-vCPU host's CPU while those VMMs restored, and starved them (issue 15,
// ten creates at once).
func waitFiles(ctx context.Context, done <-chan struct{}, paths ...string) error {
	events := make(chan struct{}, 1)
	// Ordering: the watches are in place before the first look, so a file
	// made between the two is not missed.
	if stop, err := watchDirs(paths, events); err == nil {
		defer stop()
	}
	for {
		if allExist(paths) {
			return nil
		}
		select {
		case <-done:
			return errVMMExited
		case <-ctx.Done():
			return ctx.Err()
		case <-events:
		case <-time.After(waitRecheck):
		}
	}
}

func allExist(paths []string) bool {
	for _, p := range paths {
		if !exists(p) {
			return false
		}
	}
	return true
}

// watchDirs sends on events (without blocking) whenever an entry is made in
// or moved into one of paths' directories, until stop is called.
func watchDirs(paths []string, events chan<- struct{}) (stop func(), err error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "inotify") // non-blocking: reads park in Go's poller, Close wakes them
	seen := map[string]bool{}
	for _, p := range paths {
		d := filepath.Dir(p)
		if seen[d] {
			continue
		}
		seen[d] = true
		if _, err := unix.InotifyAddWatch(fd, d, unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
			f.Close()
			return nil, err
		}
	}
	go func() {
		buf := make([]byte, 4096)
		for {
			if _, err := f.Read(buf); err != nil {
				return // closed by stop
			}
			select {
			case events <- struct{}{}:
			default:
			}
		}
	}()
	return func() { f.Close() }, nil
}
