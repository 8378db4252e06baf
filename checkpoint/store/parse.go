package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// FormatVersion is the store format version: the layout under the root
// (doc.go) and the three metadata files below, as one number, recorded in
// the root's store-version file and in every metadata file's "version".
//
// Bump it when metadata written by this code would be misread by the code
// before the change, or metadata written before by the code after it: a
// field renamed, removed, retyped or given another meaning; a field added
// that a reader cannot do without; a file or directory of the layout renamed
// or laid out differently. A field added with omitempty whose zero value
// means "as before" is not a bump (readers ignore fields they do not know).
// Then say in docs/store.md ("Format versions") what changed. A build opens
// only a root of its own version and refuses files of another (ErrVersion).
const FormatVersion = 1

// Bounds on metadata files (each is a few hundred bytes).
const (
	maxEntryFile   = 16 << 10
	maxPendingFile = 16 << 10
	maxRefFile     = 4 << 10
	// maxSize bounds a recorded size on disk (1 PiB).
	maxSize = 1 << 50
)

// Kind says how a VM snapshot holds guest memory.
type Kind string

const (
	// Full: all of guest memory in its own files.
	Full Kind = "full"
	// Incremental: only the pages dirtied since its parent; it maps its
	// parent's (and their parents') memory files too.
	Incremental Kind = "incremental"
)

// entryFile is snapshots/<id>/cube-store.json.
type entryFile struct {
	Version int       `json:"version"`
	ID      string    `json:"id"`
	Sandbox string    `json:"sandbox"`
	Parent  string    `json:"parent,omitempty"`
	Kind    Kind      `json:"kind"`
	Size    int64     `json:"size"`
	Created time.Time `json:"created"`
	// Op and Owner: the snapshot belongs to an unfinished operation of
	// process Owner (both set or neither).
	Op    string   `json:"op,omitempty"`
	Owner *Process `json:"owner,omitempty"`
}

// pendingFile is pending/<id>.json.
type pendingFile struct {
	Version int       `json:"version"`
	ID      string    `json:"id"`
	Sandbox string    `json:"sandbox"`
	Parent  string    `json:"parent,omitempty"`
	Names   []string  `json:"names,omitempty"`
	Op      string    `json:"op,omitempty"`
	Owner   Process   `json:"owner"`
	Begun   time.Time `json:"begun"`
}

// refFile is refs/<id>/<hash>.json.
type refFile struct {
	Version  int       `json:"version"`
	Snapshot string    `json:"snapshot"`
	Holder   string    `json:"holder"`
	Process  Process   `json:"process"`
	Acquired time.Time `json:"acquired"`
}

// decode checks the size and version of a metadata file and decodes it into
// v. The version is read first, so that a file of another version is refused
// as such rather than as a decoding error of fields this build does not know.
func decode(b []byte, max int, v any) error {
	if len(b) > max {
		return corrupt(fmt.Errorf("%d bytes, at most %d", len(b), max))
	}
	var ver struct {
		Version *int `json:"version"`
	}
	if err := json.Unmarshal(b, &ver); err != nil {
		return corrupt(err)
	}
	if ver.Version == nil {
		return corrupt(errors.New("no version"))
	}
	if *ver.Version != FormatVersion {
		return fmt.Errorf("version %d, this build reads %d: %w", *ver.Version, FormatVersion, ErrVersion)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return corrupt(err)
	}
	return nil
}

// checkTime accepts a recorded time: set, between 2000 and 9999.
func checkTime(field string, t time.Time) error {
	if t.Year() < 2000 || t.Year() > 9999 {
		return fmt.Errorf("%s %s out of range", field, t.Format(time.RFC3339))
	}
	return nil
}

func parseEntry(b []byte) (*entryFile, error) {
	var e entryFile
	if err := decode(b, maxEntryFile, &e); err != nil {
		return nil, err
	}
	if err := e.check(); err != nil {
		return nil, corrupt(err)
	}
	return &e, nil
}

func (e *entryFile) check() error {
	if err := checkID("id", e.ID); err != nil {
		return err
	}
	if err := checkText("sandbox", e.Sandbox); err != nil {
		return err
	}
	if e.Parent != "" {
		if err := checkID("parent", e.Parent); err != nil {
			return err
		}
		if e.Parent == e.ID {
			return errors.New("parent is the snapshot itself")
		}
	}
	switch e.Kind {
	case Full:
	case Incremental:
		if e.Parent == "" {
			return errors.New("incremental snapshot without a parent")
		}
	default:
		return fmt.Errorf("kind %q: full or incremental", e.Kind)
	}
	if e.Size < 0 || e.Size > maxSize {
		return fmt.Errorf("size %d out of range", e.Size)
	}
	if err := checkTime("created", e.Created); err != nil {
		return err
	}
	if (e.Op == "") != (e.Owner == nil) {
		return errors.New("op and owner: both or neither")
	}
	if e.Op != "" {
		if err := checkName("op", e.Op); err != nil {
			return err
		}
		return checkProcess(*e.Owner)
	}
	return nil
}

func parsePending(b []byte) (*pendingFile, error) {
	var p pendingFile
	if err := decode(b, maxPendingFile, &p); err != nil {
		return nil, err
	}
	if err := p.check(); err != nil {
		return nil, corrupt(err)
	}
	return &p, nil
}

func (p *pendingFile) check() error {
	if err := checkID("id", p.ID); err != nil {
		return err
	}
	if err := checkText("sandbox", p.Sandbox); err != nil {
		return err
	}
	if p.Parent != "" {
		if err := checkID("parent", p.Parent); err != nil {
			return err
		}
	}
	if len(p.Names) > MaxNames {
		return fmt.Errorf("%d names, at most %d", len(p.Names), MaxNames)
	}
	seen := map[string]bool{}
	for _, n := range p.Names {
		if err := checkName("name", n); err != nil {
			return err
		}
		if seen[n] {
			return fmt.Errorf("name %q twice", n)
		}
		seen[n] = true
	}
	if p.Op != "" {
		if err := checkName("op", p.Op); err != nil {
			return err
		}
	}
	if err := checkProcess(p.Owner); err != nil {
		return err
	}
	return checkTime("begun", p.Begun)
}

func parseRef(b []byte) (*refFile, error) {
	var r refFile
	if err := decode(b, maxRefFile, &r); err != nil {
		return nil, err
	}
	if err := r.check(); err != nil {
		return nil, corrupt(err)
	}
	return &r, nil
}

func (r *refFile) check() error {
	if err := checkID("snapshot", r.Snapshot); err != nil {
		return err
	}
	if err := checkText("holder", r.Holder); err != nil {
		return err
	}
	if err := checkProcess(r.Process); err != nil {
		return err
	}
	return checkTime("acquired", r.Acquired)
}

// readFile reads at most max+1 bytes of path (decode refuses the +1).
func readFile(path string, max int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, int64(max)+1))
}

// encode is the file form of a metadata record.
func encode(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
