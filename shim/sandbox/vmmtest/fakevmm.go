// Package vmmtest is a stand-in cube-vmm process for tests of code that
// launches the real binary. Its control socket is the real control server
// (hypervisor/control) over a fake target, so it answers every op cube-vmm
// answers, snapshot and rollback included, with cube-vmm's own refusals (it
// imports nothing else of ours, so any test may use it).
package vmmtest

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/cube-runtime/cube/hypervisor/control"
)

type diskFlags []string

func (d *diskFlags) String() string     { return strings.Join(*d, ";") }
func (d *diskFlags) Set(v string) error { *d = append(*d, v); return nil }

// IsFakeVMMArgs reports whether a re-executed test binary was started as a
// VMM (its first flag is -kernel, as ProcessVMM passes it).
func IsFakeVMMArgs(args []string) bool {
	return len(args) > 0 && (args[0] == "-kernel" || args[0] == "--kernel")
}

// FakeVMMMain parses cube-vmm's flags as ProcessVMM passes them, serves the
// control socket (see fakeTarget) and the hybrid vsock socket (answers
// CONNECT with OK and echoes), and logs the disks and every op to the
// -console file. It exits with 12 on stop, like cube-vmm; -kernel crash
// makes it exit 3 at once.
func FakeVMMMain(args []string) int {
	fs := flag.NewFlagSet("cube-vmm", flag.ContinueOnError)
	var disks diskFlags
	kernel := fs.String("kernel", "", "")
	fs.String("initrd", "", "")
	fs.String("cmdline", "", "")
	mem := fs.Uint("memory", 0, "")
	fs.Uint("vcpus", 0, "")
	fs.Var(&disks, "disk", "")
	var shares diskFlags
	fs.Var(&shares, "fs", "")
	vs := fs.String("vsock", "", "")
	fs.Uint("vsock-cid", 0, "")
	ctl := fs.String("control", "", "")
	console := fs.String("console", "", "")
	fs.String("console-input", "", "")
	fs.String("restore", "", "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *kernel == "crash" {
		return 3
	}
	if *mem == 0 || *vs == "" || *ctl == "" {
		fmt.Fprintln(os.Stderr, "missing flags")
		return 2
	}
	logf := func(format string, a ...any) {
		f, err := os.OpenFile(*console, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err == nil {
			fmt.Fprintf(f, format, a...)
			f.Close()
		}
	}
	logf("disks=%s\n", disks.String())
	if len(shares) > 0 {
		logf("fs=%s\n", shares.String())
	}
	vl, err := net.Listen("unix", *vs)
	if err != nil {
		return 4
	}
	go serveVsock(vl)
	t := &fakeTarget{logf: logf, stopped: make(chan struct{})}
	srv, err := control.Listen(*ctl, t)
	if err != nil {
		return 4
	}
	<-t.stopped
	srv.Close()
	return 12
}

// serveVsock answers every CONNECT line with OK and then echoes.
func serveVsock(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			r := bufio.NewReader(c)
			if _, err := r.ReadString('\n'); err != nil {
				return
			}
			io.WriteString(c, "OK 99\n")
			io.Copy(c, r)
		}()
	}
}

// fakeTarget is a VM that only records: pause, resume, info (its state),
// stop (the process exits 12), disk-set (any drive, any file), snapshot (a
// directory with a marker file; one that exists is refused) and rollback
// (to such a directory only).
type fakeTarget struct {
	logf     func(format string, a ...any)
	mu       sync.Mutex
	paused   bool
	stopOnce sync.Once
	stopped  chan struct{}
}

const snapshotMarker = "fake-vmm-snapshot"

func (f *fakeTarget) Pause() error  { return f.set(true) }
func (f *fakeTarget) Resume() error { return f.set(false) }

func (f *fakeTarget) set(paused bool) error {
	f.mu.Lock()
	f.paused = paused
	f.mu.Unlock()
	f.logf("paused=%v\n", paused)
	return nil
}

func (f *fakeTarget) Stop() { f.stopOnce.Do(func() { close(f.stopped) }) }

func (f *fakeTarget) InfoJSON() (json.RawMessage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.paused {
		return json.RawMessage(`{"state":"paused"}`), nil
	}
	return json.RawMessage(`{"state":"running"}`), nil
}

func (f *fakeTarget) SetDisk(serial, path string, _ bool) (*control.DiskSetResult, error) {
	f.logf("disk-set %s %s\n", serial, path)
	return &control.DiskSetResult{Serial: serial, Path: path}, nil
}

func (f *fakeTarget) Snapshot(dir string, incremental bool) (*control.SnapshotResult, error) {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, snapshotMarker), nil, 0o600); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	f.logf("snapshot %s incremental=%v\n", dir, incremental)
	return &control.SnapshotResult{Dir: dir}, nil
}

func (f *fakeTarget) Rollback(dir string) (*control.RollbackResult, error) {
	if _, err := os.Stat(filepath.Join(dir, snapshotMarker)); err != nil {
		return nil, fmt.Errorf("rollback: no snapshot of this VMM in %s: %w", dir, err)
	}
	f.logf("rollback %s\n", dir)
	return &control.RollbackResult{Dir: dir, Memory: "rewrite-all"}, nil
}
