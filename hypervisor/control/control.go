// Package control is the VMM's control socket: a Unix stream socket
// speaking newline-delimited JSON, one request and one response per line.
//
//	→ {"op":"pause"}            ← {"ok":true}
//	→ {"op":"info"}             ← {"ok":true,"info":{...}}
//	→ {"op":"bogus"}            ← {"ok":false,"error":"unknown op \"bogus\""}
//
//	→ {"op":"snapshot","dir":"/snaps/a"}  ← {"ok":true,"result":{...}}
//	→ {"op":"rollback","dir":"/snaps/a"}  ← {"ok":true,"result":{...}}
//	→ {"op":"disk-set","serial":"cube-slot-1","path":"/img/c2.img"}
//	                                      ← {"ok":true,"result":{"serial":…,"path":…,"sectors":N}}
//	→ {"op":"disk-set","serial":"cube-slot-2","path":"/dev/loop3","read_only":true}
//	                                      (a read-only medium: writes fail with IOERR)
//	→ {"op":"restore","dir":"/snaps/a"}   ← {"ok":true,"result":{...}}   (a standby VMM only)
//
// Ops (the Op constants): pause, resume, stop, info, snapshot/rollback when
// the target implements Snapshotter, and disk-set (re-point a drive at
// another backing file, a media change) when it implements DiskSetter,
// restore (once, into a standby VMM that has no VM yet) when it implements
// Restorer; the server's target may then change (SetTarget). Every file or
// directory a request names must be absolute (the VMM's working directory
// is not the client's); the server refuses any other before the op runs.
//
// Server serves a Target; Client is the one client (the shim, the snapshot
// tests and tools drive a running cube-vmm through it), which decodes each
// op's result into its type (SnapshotResult, RollbackResult, RestoreResult,
// DiskSetResult). The package imports nothing of ours, so a client links no
// VMM code.
package control

import (
	"encoding/json"
	"fmt"
	"path/filepath"
)

// Op names: a Request's Op.
const (
	OpPause    = "pause"
	OpResume   = "resume"
	OpStop     = "stop"
	OpInfo     = "info"
	OpSnapshot = "snapshot"
	OpRollback = "rollback"
	OpRestore  = "restore"
	OpDiskSet  = "disk-set"
)

// knownOps are the ops a Server answers (for some targets with a refusal).
var knownOps = map[string]bool{OpPause: true, OpResume: true, OpStop: true, OpInfo: true,
	OpSnapshot: true, OpRollback: true, OpRestore: true, OpDiskSet: true}

// Request is one command.
type Request struct {
	Op          string `json:"op"`
	Dir         string `json:"dir,omitempty"`         // snapshot, rollback, restore: absolute
	Incremental bool   `json:"incremental,omitempty"` // snapshot
	Serial      string `json:"serial,omitempty"`      // disk-set
	Path        string `json:"path,omitempty"`        // disk-set: absolute
	ReadOnly    bool   `json:"read_only,omitempty"`   // disk-set: the medium refuses writes (IOERR)
	Paused      bool   `json:"paused,omitempty"`      // restore: vCPUs parked until resume
}

// checkPaths refuses a request that names a relative file or directory: the
// VMM would resolve it against its own working directory, not the client's.
// The server checks this here, once, for every op.
func (r Request) checkPaths() error {
	for _, f := range []struct{ field, value string }{{"dir", r.Dir}, {"path", r.Path}} {
		if f.value != "" && !filepath.IsAbs(f.value) {
			return fmt.Errorf("%s: %s %q is not absolute (cube-vmm resolves paths against its own working directory): send an absolute %s",
				r.Op, f.field, f.value, f.field)
		}
	}
	return nil
}

// Response answers one Request.
type Response struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	// Info is the info op's payload (the target's own JSON).
	Info json.RawMessage `json:"info,omitempty"`
	// Result is an op's outcome: one of the result types below, encoded.
	Result json.RawMessage `json:"result,omitempty"`
}

// SnapshotResult is the snapshot op's outcome: cube-vmm's figures, times in
// milliseconds.
type SnapshotResult struct {
	Dir       string  `json:"dir"`
	FrozenMS  float64 `json:"frozen_ms"`
	TotalMS   float64 `json:"total_ms"`
	PrecopyMS float64 `json:"precopy_ms"` // 0: no pre-copy (paused VM, incremental snapshot)
	// MemoryBytes counts the pre-copy and the pages written again while
	// frozen (RecopiedBytes).
	MemoryBytes   int64 `json:"memory_bytes"`
	RecopiedBytes int64 `json:"recopied_bytes"`
	DiskBytes     int64 `json:"disk_bytes"`
	Reflinked     bool  `json:"reflinked"`
}

// RollbackResult is the rollback op's outcome, times in milliseconds.
type RollbackResult struct {
	Dir       string  `json:"dir"`
	PrepareMS float64 `json:"prepare_ms"`
	FrozenMS  float64 `json:"frozen_ms"`
	// Memory: which pages were read back: "rewrite-dirty" (the VM's parent:
	// those written since), "rewrite-diff" (a snapshot sharing layers with
	// the parent: also those of the layers not shared) or "rewrite-all";
	// Pages: how many were rewritten.
	Memory  string  `json:"memory"`
	Pages   int64   `json:"pages_rewritten"`
	TotalMS float64 `json:"total_ms"`
}

// RestoreResult is the restore op's outcome (a standby VMM's).
type RestoreResult struct {
	Dir    string  `json:"dir"`
	TookMS float64 `json:"took_ms"`
	Paused bool    `json:"paused"`
}

// DiskSetResult is the disk-set op's outcome: the drive's new file and its
// capacity in 512-byte sectors.
type DiskSetResult struct {
	Serial  string `json:"serial"`
	Path    string `json:"path"`
	Sectors uint64 `json:"sectors"`
}
