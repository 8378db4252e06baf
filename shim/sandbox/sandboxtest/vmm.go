// Package sandboxtest has in-process fakes of the VMM and the guest agent so
// that the shim's task service can be tested without KVM or a guest. Only
// tests import it.
package sandboxtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"

	"github.com/cube-runtime/cube/hypervisor/control"
	"github.com/cube-runtime/cube/shim/sandbox"
)

// VMM is a fake sandbox.VMM. Crash ends it as if the process died.
type VMM struct {
	mu     sync.Mutex
	Config sandbox.VMConfig
	Paused bool
	Disks  map[string]string // serial -> backing path
	// ReadOnly holds the serials whose medium SetDisk set read-only.
	ReadOnly map[string]bool
	// SetDiskErr, when set and non-nil for a serial and path, is SetDisk's
	// answer (the drive unchanged).
	SetDiskErr func(serial, path string) error
	setDisks   int // SetDisk calls
	started    bool
	done       chan struct{}
	exit       sandbox.VMExit
	StartErr   error
	Agent      *Agent // crashed along with the VM
	// Snapshots lists the dirs Snapshot wrote, Incremental whether each was
	// incremental; SnapshotErr makes it fail. SnapshotFunc, when set, writes
	// the snapshot instead of the marker file (a test of the snapshot store's
	// users writes a real VM snapshot there, or blocks to hold the VM busy).
	Snapshots    []string
	Incremental  []bool
	SnapshotErr  error
	SnapshotFunc func(ctx context.Context, dir string, incremental bool) (control.SnapshotResult, error)
	// Rollbacks lists the dirs Rollback rolled back to; RollbackErr makes
	// it fail (the VM unchanged); RollbackFunc, when set, runs first (a test
	// blocks in it to hold the VM busy).
	Rollbacks    []string
	RollbackErr  error
	RollbackFunc func(ctx context.Context, dir string) error
	// PID is what Pid reports once started (0: 424242, no such process).
	PID int
	// saved is the fake agent's state at each snapshot, by dir.
	saved map[string]*AgentState
	last  string
}

// NewVMM returns a fake VMM whose agent is a.
func NewVMM(a *Agent) *VMM {
	return &VMM{done: make(chan struct{}), Disks: map[string]string{}, ReadOnly: map[string]bool{}, Agent: a}
}

func (v *VMM) Start(ctx context.Context, cfg sandbox.VMConfig) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.StartErr != nil {
		return v.StartErr
	}
	if v.started {
		return errors.New("fake vmm: started twice")
	}
	v.started, v.Config = true, cfg
	for _, d := range cfg.Disks {
		v.Disks[d.Serial] = d.Path
	}
	// Like the real VMM, create the sockets so cleanup has something to remove.
	for _, p := range []string{cfg.VsockPath, cfg.ControlPath} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			return err
		}
	}
	if v.Agent != nil {
		v.Agent.setDisks(v.diskView)
	}
	return nil
}

func (v *VMM) diskView(serial string) (string, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	p, ok := v.Disks[serial]
	return p, ok
}

func (v *VMM) Pid() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.started {
		return 0
	}
	if v.PID != 0 {
		return v.PID
	}
	return 424242
}

func (v *VMM) alive() error {
	select {
	case <-v.done:
		return errors.New("fake vmm: not running")
	default:
		return nil
	}
}

func (v *VMM) Pause(ctx context.Context) error {
	if err := v.alive(); err != nil {
		return err
	}
	v.mu.Lock()
	v.Paused = true
	v.mu.Unlock()
	return nil
}

func (v *VMM) Resume(ctx context.Context) error {
	if err := v.alive(); err != nil {
		return err
	}
	v.mu.Lock()
	v.Paused = false
	v.mu.Unlock()
	return nil
}

// SetDiskCount is how many SetDisk calls the VMM had.
func (v *VMM) SetDiskCount() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.setDisks
}

func (v *VMM) SetDisk(ctx context.Context, serial, path string, readOnly bool) error {
	if err := v.alive(); err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.setDisks++
	if _, ok := v.Disks[serial]; !ok {
		return fmt.Errorf("fake vmm: no drive %q", serial)
	}
	if v.SetDiskErr != nil {
		if err := v.SetDiskErr(serial, path); err != nil {
			return err
		}
	}
	v.Disks[serial] = path
	if readOnly {
		v.ReadOnly[serial] = true
	} else {
		delete(v.ReadOnly, serial)
	}
	return nil
}

// Snapshot writes a marker file into dir (which must not exist), or calls
// SnapshotFunc, and records the call; SnapshotErr, when set, is returned
// instead.
func (v *VMM) Snapshot(ctx context.Context, dir string, incremental bool) (control.SnapshotResult, error) {
	if err := v.alive(); err != nil {
		return control.SnapshotResult{}, err
	}
	v.mu.Lock()
	fail, write := v.SnapshotErr, v.SnapshotFunc
	v.mu.Unlock()
	if fail != nil {
		return control.SnapshotResult{}, fail
	}
	res := control.SnapshotResult{Dir: dir}
	if write != nil {
		var err error
		if res, err = write(ctx, dir, incremental); err != nil {
			return control.SnapshotResult{}, err
		}
	} else if err := writeMarker(dir); err != nil {
		return control.SnapshotResult{}, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.Snapshots = append(v.Snapshots, dir)
	v.Incremental = append(v.Incremental, incremental)
	if v.Agent != nil {
		if v.saved == nil {
			v.saved = map[string]*AgentState{}
		}
		v.saved[dir] = v.Agent.Save()
	}
	v.last = dir
	return res, nil
}

// Rollback brings the fake agent's processes back to what they were at the
// snapshot in dir (one this VMM took) and resets its connections, as the
// real VMM's transport reset does: pending Waits fail, streams end.
// "rewrite-dirty" when dir is the VM's parent, "rewrite-all" otherwise.
func (v *VMM) Rollback(ctx context.Context, dir string) (control.RollbackResult, error) {
	if err := v.alive(); err != nil {
		return control.RollbackResult{}, err
	}
	v.mu.Lock()
	fail, hook, st, last := v.RollbackErr, v.RollbackFunc, v.saved[dir], v.last
	v.mu.Unlock()
	if hook != nil {
		if err := hook(ctx, dir); err != nil {
			return control.RollbackResult{}, err
		}
	}
	if fail != nil {
		return control.RollbackResult{}, fail
	}
	if st == nil {
		return control.RollbackResult{}, &control.RefusedError{Op: control.OpRollback, Reason: "no snapshot of this VM in " + dir}
	}
	res := control.RollbackResult{Dir: dir, Memory: "rewrite-all", PrepareMS: 1, FrozenMS: 2, TotalMS: 3}
	if dir == last {
		res.Memory, res.Pages = "rewrite-dirty", 42
	}
	if v.Agent != nil {
		v.Agent.Restore(st)
	}
	v.mu.Lock()
	v.Rollbacks = append(v.Rollbacks, dir)
	v.last = dir
	v.mu.Unlock()
	return res, nil
}

func writeMarker(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("fake vmm: snapshot: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, "manifest.json"), []byte(`{"fake":true}`), 0o600)
}

// Stop ends the VM with status 0.
func (v *VMM) Stop(ctx context.Context) error {
	v.end(sandbox.VMExit{})
	return nil
}

// Crash ends the VM as a killed VMM process would (status 128+9).
func (v *VMM) Crash() {
	v.end(sandbox.VMExit{Status: 137, Err: errors.New("fake vmm killed")})
}

func (v *VMM) end(e sandbox.VMExit) {
	v.mu.Lock()
	select {
	case <-v.done:
		v.mu.Unlock()
		return
	default:
	}
	v.exit = e
	close(v.done)
	a := v.Agent
	v.mu.Unlock()
	if a != nil {
		a.die()
	}
}

func (v *VMM) Wait() <-chan struct{} { return v.done }

func (v *VMM) Exit() sandbox.VMExit {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.exit
}

func (v *VMM) DialVsock(ctx context.Context, port uint32) (net.Conn, error) {
	return nil, errors.New("fake vmm: no vsock; use the fake agent's dialer")
}

// Dialer returns an AgentDialer that hands out a.
func Dialer(a *Agent) sandbox.AgentDialer {
	return func(ctx context.Context, vmm sandbox.VMM) (sandbox.AgentClient, error) {
		return a, nil
	}
}
