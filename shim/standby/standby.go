// Package standby keeps restored template VMs ready for the next sandbox.
//
// A shim that started a sandbox from a template leaves one standby VM of
// that template behind (cube-vmm restore, every drive slot on a stub, run at
// idle CPU priority so it is made only with CPU nobody else wants); the next
// sandbox of that template adopts it instead of restoring one: the VMM's
// process start and the restore are off its path (docs/shim.md, *Standby
// VMs*). This package is the standbys' directory protocol, shared by the
// shims that make and adopt them and by `cube templates`:
//
//	<state_dir>/sb-<16 hex>/        one standby (short: it holds Unix sockets)
//	    standby.json                Record; present while the standby is free
//	    claimed.json                the Record, renamed by the shim that adopted it
//	    control.sock vsock.sock     cube-vmm's sockets
//	    console.log vmm.log         the guest console, cube-vmm's own output
//	    slot-N.img                  the drive slots' stubs
//	<state_dir>/standby.lock        flock held while a standby is made
//
// A standby is free only while its standby.json exists: claiming renames
// it (one claimer wins), so no lock is held across the adoption. A record
// whose VMM is gone (pid dead, or reused by another process: the start time
// is recorded) is removed with its directory by whoever meets it.
package standby

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/shim/procstat"
)

const (
	// DirPrefix starts every standby directory's name under the state dir.
	DirPrefix = "sb-"
	// RecordName is the record of a free standby.
	RecordName = "standby.json"
	// ClaimedName is the record once a shim adopted the standby.
	ClaimedName = "claimed.json"
	// LockName is the flock held while a standby is made.
	LockName = "standby.lock"
	// LogName receives cube-vmm's stdout and stderr.
	LogName = "vmm.log"
)

// Record says what a standby is.
type Record struct {
	// Template is the snapshot directory the VM was restored from.
	Template string `json:"template"`
	// Pid is the cube-vmm process; StartTime its start time in clock ticks
	// since boot (/proc/<pid>/stat field 22), which a reused pid lacks.
	Pid       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
	// Slots is how many drive slots the VM has (slot-0.img … in the directory).
	Slots int       `json:"slots"`
	Made  time.Time `json:"made"`
}

// Standby is a standby VM found in the state dir.
type Standby struct {
	Dir    string
	Record Record
}

// Write publishes a standby: its record appears atomically (written beside
// and renamed), so a claimer never reads half a record.
func Write(dir string, r Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, RecordName+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("standby %s: write record: %w", dir, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, RecordName)); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("standby %s: publish record: %w", dir, err)
	}
	return nil
}

// ReadRecord reads one record file; a record that does not parse or names
// no process is refused (errdefs.ErrDataLoss: the directory is removed).
func ReadRecord(path string) (Record, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Record{}, err
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return Record{}, fmt.Errorf("standby record %s: %v: %w", path, err, errdefs.ErrDataLoss)
	}
	if r.Pid <= 0 || r.Template == "" || r.Slots < 0 || r.Slots > 64 {
		return Record{}, fmt.Errorf("standby record %s: pid %d, template %q, slots %d: %w", path, r.Pid, r.Template, r.Slots, errdefs.ErrDataLoss)
	}
	return r, nil
}

// List returns the free standbys under stateDir (all templates), removing
// those whose VMM is gone.
func List(stateDir string) ([]Standby, error) {
	ents, err := os.ReadDir(stateDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("standbys in %s: %w", stateDir, err)
	}
	var out []Standby
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), DirPrefix) {
			continue
		}
		dir := filepath.Join(stateDir, e.Name())
		r, err := ReadRecord(filepath.Join(dir, RecordName))
		if errors.Is(err, os.ErrNotExist) {
			continue // being made, or adopted: not ours to judge
		}
		if err != nil || !Alive(r.Pid, r.StartTime) {
			_ = os.RemoveAll(dir)
			continue
		}
		out = append(out, Standby{Dir: dir, Record: r})
	}
	return out, nil
}

// Claim adopts a free standby of template: the one whose record this call
// renamed to claimed.json. ok is false when there is none. The caller owns
// the directory and the VMM from then on (and removes both).
func Claim(stateDir, template string) (s Standby, ok bool, err error) {
	all, err := List(stateDir)
	if err != nil {
		return Standby{}, false, err
	}
	for _, c := range all {
		if c.Record.Template != template {
			continue
		}
		if !take(c.Dir) {
			continue
		}
		// The VMM may have died between List and the rename.
		if !Alive(c.Record.Pid, c.Record.StartTime) {
			_ = os.RemoveAll(c.Dir)
			continue
		}
		return c, true, nil
	}
	return Standby{}, false, nil
}

// take claims the standby in dir: its record is renamed to claimed.json,
// which one caller alone can do (the others get ENOENT). false when
// another took it first.
func take(dir string) bool {
	return os.Rename(filepath.Join(dir, RecordName), filepath.Join(dir, ClaimedName)) == nil
}

// Stop ends free standbys (of template, or all when template is ""): each
// is claimed first, so none is stopped while a shim adopts it. It returns
// how many it stopped.
func Stop(stateDir, template string) (int, error) {
	all, err := List(stateDir)
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, c := range all {
		if template != "" && c.Record.Template != template {
			continue
		}
		if !take(c.Dir) {
			continue // adopted meanwhile
		}
		if err := Kill(c.Record.Pid, c.Record.StartTime); err != nil {
			errs = append(errs, fmt.Errorf("standby %s: %w", c.Dir, err))
			continue
		}
		_ = os.RemoveAll(c.Dir)
		n++
	}
	return n, errors.Join(errs...)
}

// Kill sends SIGKILL to the standby's VMM through a pidfd opened after the
// start time matched, so a reused pid is never signalled.
func Kill(pid int, startTime uint64) error {
	fd, err := Open(pid, startTime)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
		return err
	}
	defer unix.Close(fd)
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill vmm pid %d: %w", pid, err)
	}
	return nil
}

// Open returns a pidfd for the standby's VMM, NotFound when pid is gone or
// is another process now.
func Open(pid int, startTime uint64) (int, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return -1, fmt.Errorf("vmm pid %d: %w", pid, errdefs.ErrNotFound)
		}
		return -1, fmt.Errorf("pidfd of vmm pid %d: %w", pid, err)
	}
	// Ordering: checked after the pidfd exists: the pid cannot be reused
	// behind it, so a match now is the same process for the fd's life.
	if st, err := StartTime(pid); err != nil || st != startTime {
		unix.Close(fd)
		return -1, fmt.Errorf("vmm pid %d is another process now: %w", pid, errdefs.ErrNotFound)
	}
	return fd, nil
}

// Alive says whether pid is the process that started at startTime.
func Alive(pid int, startTime uint64) bool {
	st, err := StartTime(pid)
	return err == nil && st == startTime
}

// StartTime is a process's start time (clock ticks since boot, from
// /proc/<pid>/stat); a zombie counts as gone (errdefs.ErrNotFound).
func StartTime(pid int) (uint64, error) {
	st, err := procstat.Read(pid)
	if err != nil {
		return 0, err
	}
	if st.Exited() {
		return 0, fmt.Errorf("pid %d has exited (state %c): %w", pid, st.State, errdefs.ErrNotFound)
	}
	return st.Start, nil
}
