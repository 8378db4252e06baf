package snapshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// File names inside a snapshot directory.
const (
	ManifestName = "manifest.json"
	StateName    = "state.bin"
	MemoryName   = "memory.bin"
	// BitmapName is a diff layer's page bitmap.
	BitmapName = "memory.bitmap"
)

// DiskName is the name of writable disk i's copy (i counts all disks in
// PCI order, read-only ones included).
func DiskName(i int) string { return fmt.Sprintf("disk-%d.img", i) }

// maxManifest bounds the manifest read (it is a few KiB).
const maxManifest = 1 << 20

// ErrVersion, ErrChecksum, ErrTruncated and ErrMismatch classify refusals
// (errors.Is works on the detailed errors Open, CheckShape and CheckComponents
// return).
var (
	ErrVersion   = errors.New("unsupported snapshot format version")
	ErrChecksum  = errors.New("snapshot checksum mismatch")
	ErrTruncated = errors.New("snapshot file truncated")
	ErrMismatch  = errors.New("snapshot does not match this VM")
	ErrCorrupt   = errors.New("snapshot is malformed")
)

// Manifest describes a snapshot.
type Manifest struct {
	FormatVersion int        `json:"format_version"` // Version
	Created       string     `json:"created"`        // RFC 3339, informational
	Shape         Shape      `json:"shape"`
	Components    Components `json:"components"`
	// Memory is guest RAM: one layer for a full snapshot; an incremental
	// snapshot lists its parent's layers first, then its own. Restore
	// composes them in order (later layers win for the pages they hold).
	Memory []MemoryLayer `json:"memory"`
	State  StateFile     `json:"state"`
	// Config is the VMM's own description of how to rebuild the VM
	// (opaque here; cube-vmm stores its configuration).
	Config json.RawMessage `json:"config,omitempty"`
}

// Shape is what must match between a snapshot and the VM restored from it.
type Shape struct {
	VCPUs     int    `json:"vcpus"`
	MemoryMiB int    `json:"memory_mib"`
	Disks     []Disk `json:"disks"`
}

// Disk is one virtio-blk disk in PCI order.
type Disk struct {
	Serial   string `json:"serial,omitempty"`
	ReadOnly bool   `json:"read_only"`
	Size     int64  `json:"size"`
	// File is the disk copy inside the snapshot (writable disks only).
	File string `json:"file,omitempty"`
	// Source is where the running VM had the disk (informational; restore
	// may put the working copy elsewhere).
	Source string `json:"source"`
}

// Components identifies what ran the VM; restore refuses a different set.
type Components struct {
	KernelSHA256 string `json:"kernel_sha256"`
	InitrdSHA256 string `json:"initrd_sha256,omitempty"`
	VMMVersion   string `json:"vmm_version"`
	AgentVersion string `json:"agent_version,omitempty"`
}

// MemoryLayer is one memory file. A full layer holds every page at its
// guest offset (sparse where zero); a diff layer holds only the pages set
// in its bitmap file (one bit per 4 KiB page, little-endian uint64 words),
// at their guest offsets, the rest being holes.
type MemoryLayer struct {
	File   string `json:"file"` // relative to the snapshot directory, may be ../parent/memory.bin
	Size   int64  `json:"size"`
	Bitmap string `json:"bitmap,omitempty"` // empty: full layer
}

// StateFile names and checks the state file.
type StateFile struct {
	File string `json:"file"`
	Size int64  `json:"size"`
}

// ParseManifest decodes and validates a manifest.
func ParseManifest(b []byte) (*Manifest, error) {
	if len(b) > maxManifest {
		return nil, fmt.Errorf("manifest: %d bytes: %w", len(b), ErrCorrupt)
	}
	// Read the version first so a newer format is refused as such, not as
	// a decoding error of fields we do not know.
	var v struct {
		FormatVersion *int `json:"format_version"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("manifest: %v: %w", err, ErrCorrupt)
	}
	if v.FormatVersion == nil {
		return nil, fmt.Errorf("manifest: no format_version: %w", ErrCorrupt)
	}
	if *v.FormatVersion != Version {
		return nil, fmt.Errorf("manifest: format version %d, this build reads %d: %w", *v.FormatVersion, Version, ErrVersion)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("manifest: %v: %w", err, ErrCorrupt)
	}
	if err := m.validate(); err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	return &m, nil
}

func (m *Manifest) validate() error {
	s := m.Shape
	if s.VCPUs < 1 || s.VCPUs > 254 {
		return fmt.Errorf("%d vCPUs: %w", s.VCPUs, ErrCorrupt)
	}
	if s.MemoryMiB < 1 || s.MemoryMiB > 1<<20 {
		return fmt.Errorf("memory %d MiB: %w", s.MemoryMiB, ErrCorrupt)
	}
	if len(s.Disks) > 64 {
		return fmt.Errorf("%d disks: %w", len(s.Disks), ErrCorrupt)
	}
	for i, d := range s.Disks {
		if d.Size < 0 {
			return fmt.Errorf("disk %d size %d: %w", i, d.Size, ErrCorrupt)
		}
		if d.File != "" {
			if err := localName(d.File); err != nil {
				return fmt.Errorf("disk %d: %w", i, err)
			}
		} else if !d.ReadOnly {
			return fmt.Errorf("writable disk %d has no copy: %w", i, ErrCorrupt)
		}
	}
	if len(m.Memory) == 0 || len(m.Memory) > 4096 {
		return fmt.Errorf("%d memory layers: %w", len(m.Memory), ErrCorrupt)
	}
	want := int64(s.MemoryMiB) << 20
	for i, l := range m.Memory {
		if err := layerName(l.File); err != nil {
			return fmt.Errorf("memory layer %d: %w", i, err)
		}
		if l.Bitmap != "" {
			if err := layerName(l.Bitmap); err != nil {
				return fmt.Errorf("memory layer %d bitmap: %w", i, err)
			}
		} else if i != 0 {
			return fmt.Errorf("memory layer %d is full but not the base: %w", i, ErrCorrupt)
		}
		if l.Size != want {
			return fmt.Errorf("memory layer %d is %d bytes, shape says %d: %w", i, l.Size, want, ErrCorrupt)
		}
	}
	if m.Memory[0].Bitmap != "" {
		return fmt.Errorf("memory base layer is a diff: %w", ErrCorrupt)
	}
	if err := localName(m.State.File); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	if m.State.Size < stateOverhead || m.State.Size > MaxStateSize+stateOverhead {
		return fmt.Errorf("state size %d: %w", m.State.Size, ErrCorrupt)
	}
	return nil
}

// localName accepts a plain file name inside the snapshot directory.
func localName(n string) error {
	if n == "" || n != filepath.Base(n) || n == "." || n == ".." || strings.ContainsRune(n, 0) {
		return fmt.Errorf("file name %q: %w", n, ErrCorrupt)
	}
	return nil
}

// layerName accepts a file in this directory or in a sibling (a parent
// snapshot): NAME or ../DIR/NAME.
func layerName(n string) error {
	if localName(n) == nil {
		return nil
	}
	parts := strings.Split(n, "/")
	if len(parts) == 3 && parts[0] == ".." && localName(parts[1]) == nil && localName(parts[2]) == nil {
		return nil
	}
	return fmt.Errorf("layer file %q: %w", n, ErrCorrupt)
}

// A manifest is checked in two parts. In itself (file names, bounds, layer
// sizes against its own shape): ParseManifest does it, so every manifest Open
// returns is consistent. Against the VM it is meant for: CheckShape and
// CheckComponents, each given what one caller alone knows (machine.Rollback
// the running VM's shape, cube-vmm the components it runs).

// CheckShape refuses a snapshot whose shape differs from the VM's: vCPUs,
// memory, and each disk's kind, serial and size in PCI order. The disk files
// and Source paths are not compared (restore may put the copies elsewhere).
func (m *Manifest) CheckShape(vm Shape) error {
	s := m.Shape
	if s.VCPUs != vm.VCPUs {
		return fmt.Errorf("snapshot has %d vCPUs, VM has %d: %w", s.VCPUs, vm.VCPUs, ErrMismatch)
	}
	if s.MemoryMiB != vm.MemoryMiB {
		return fmt.Errorf("snapshot has %d MiB memory, VM has %d: %w", s.MemoryMiB, vm.MemoryMiB, ErrMismatch)
	}
	if len(s.Disks) != len(vm.Disks) {
		return fmt.Errorf("snapshot has %d disks, VM has %d: %w", len(s.Disks), len(vm.Disks), ErrMismatch)
	}
	for i, d := range s.Disks {
		o := vm.Disks[i]
		if d.ReadOnly != o.ReadOnly || d.Serial != o.Serial || d.Size != o.Size {
			return fmt.Errorf("disk %d: snapshot has %s, VM has %s: %w", i, diskString(d), diskString(o), ErrMismatch)
		}
	}
	return nil
}

// CheckComponents refuses a snapshot made with other components (kernel,
// initrd, VMM, agent) than the VM's.
func (m *Manifest) CheckComponents(vm Components) error {
	c := m.Components
	for _, f := range []struct{ name, a, b string }{
		{"kernel sha256", c.KernelSHA256, vm.KernelSHA256},
		{"initrd sha256", c.InitrdSHA256, vm.InitrdSHA256},
		{"VMM version", c.VMMVersion, vm.VMMVersion},
		{"agent version", c.AgentVersion, vm.AgentVersion},
	} {
		if f.a != f.b {
			return fmt.Errorf("%s: snapshot has %q, VM has %q: %w", f.name, f.a, f.b, ErrMismatch)
		}
	}
	return nil
}

func diskString(d Disk) string {
	ro := "rw"
	if d.ReadOnly {
		ro = "ro"
	}
	return fmt.Sprintf("%s %d bytes serial %q", ro, d.Size, d.Serial)
}

func marshalManifest(m *Manifest) ([]byte, error) {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("snapshot manifest: %w", err)
	}
	return append(b, '\n'), nil
}
