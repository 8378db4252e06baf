package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cube-runtime/cube/checkpoint/snapshots"
	"github.com/cube-runtime/cube/checkpoint/store"
	api "github.com/cube-runtime/cube/shim/snapshotapi"
)

// Description is a snapshot as `cube snapshots inspect` and `cube snapshot
// --json` print it.
type Description struct {
	ID      string    `json:"id"`
	Names   []string  `json:"names"`
	Sandbox string    `json:"sandbox"`
	Kind    string    `json:"kind"`
	Parent  string    `json:"parent,omitempty"`
	Size    int64     `json:"size"`
	Created time.Time `json:"created"`
	Dir     string    `json:"dir"`
	Op      string    `json:"op,omitempty"`
	Holders []Holder  `json:"holders"`
	// VM is the shim's record: present while the sandbox's shim runs and
	// remembers the snapshot.
	VM *VM `json:"vm,omitempty"`
}

// Holder is a reference to a snapshot (a VM that maps it).
type Holder struct {
	Name     string    `json:"name"`
	PID      int       `json:"pid"`
	Acquired time.Time `json:"acquired"`
	Stale    bool      `json:"stale,omitempty"`
}

// VM is the shim's account of a snapshot: timings in milliseconds, bytes.
type VM struct {
	Container     string    `json:"container"`
	VMMPid        uint32    `json:"vmm_pid"`
	Incremental   bool      `json:"incremental"`
	Base          bool      `json:"base"`
	Started       time.Time `json:"started"`
	FrozenMS      float64   `json:"frozen_ms"`
	TotalMS       float64   `json:"total_ms"`
	SyncMS        float64   `json:"sync_ms"`
	PrecopyMS     float64   `json:"precopy_ms"`
	VMMTotalMS    float64   `json:"vmm_total_ms"`
	MemoryBytes   int64     `json:"memory_bytes"`
	RecopiedBytes int64     `json:"recopied_bytes"`
	DiskBytes     int64     `json:"disk_bytes"`
	Reflinked     bool      `json:"reflinked"`
}

// describe joins the store's snapshot and the shim's record (nil: none).
func describe(s store.Snapshot, rec *api.Snapshot) Description {
	d := Description{ID: s.ID, Names: s.Names, Sandbox: s.Sandbox, Kind: string(s.Kind), Parent: s.Parent,
		Size: s.Size, Created: s.Created, Dir: s.Dir, Op: s.Op, Holders: []Holder{}}
	if d.Names == nil {
		d.Names = []string{}
	}
	for _, h := range s.Holders {
		d.Holders = append(d.Holders, Holder{Name: h.Holder, PID: h.Process.PID, Acquired: h.Acquired, Stale: h.Stale})
	}
	if rec != nil {
		t, z := rec.GetTimings(), rec.GetSizes()
		d.VM = &VM{Container: rec.ContainerId, VMMPid: rec.VmmPid, Incremental: rec.Incremental, Base: rec.Base,
			Started: time.Unix(0, rec.StartedUnixNano).UTC(), FrozenMS: t.GetFrozenMs(), TotalMS: t.GetTotalMs(),
			SyncMS: t.GetSyncMs(), PrecopyMS: t.GetPrecopyMs(), VMMTotalMS: t.GetVmmTotalMs(),
			MemoryBytes: z.GetMemoryBytes(), RecopiedBytes: z.GetRecopiedBytes(), DiskBytes: z.GetDiskBytes(), Reflinked: z.GetReflinked()}
	}
	return d
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printTaken prints `cube snapshot`'s result for a person.
func printTaken(w io.Writer, t snapshots.Taken) {
	s, vm := t.Snapshot, t.VM
	tw := tabwriter.NewWriter(w, 0, 8, 1, ' ', 0)
	row := func(k, format string, a ...any) { fmt.Fprintf(tw, "%s:\t"+format+"\n", append([]any{k}, a...)...) }
	row("id", "%s", s.ID)
	row("names", "%s", orDash(strings.Join(s.Names, ", ")))
	row("sandbox", "%s", s.Sandbox)
	row("kind", "%s", s.Kind)
	row("parent", "%s", orDash(s.Parent))
	row("size", "%s on disk", bytesHuman(s.Size))
	if tm, z := vm.GetTimings(), vm.GetSizes(); tm != nil && z != nil {
		row("frozen", "%.1f ms", tm.FrozenMs)
		row("total", "%.1f ms (guest sync %.1f ms, pre-copy %.1f ms)", tm.TotalMs, tm.SyncMs, tm.PrecopyMs)
		row("memory", "%s written", bytesHuman(z.MemoryBytes))
		disks := bytesHuman(z.DiskBytes)
		if z.Reflinked {
			disks += " (reflinked)"
		}
		row("disks", "%s", disks)
	}
	row("dir", "%s", s.Dir)
	tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// bytesHuman prints n bytes in binary units.
func bytesHuman(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
