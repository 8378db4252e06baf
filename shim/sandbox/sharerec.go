package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
)

// A snapshot of a VM with host directories shared (docs/shim.md,
// "Volumes"): cube-vmm carries the guest's FUSE session (the node ids and
// open files it holds below the share, as paths) and re-opens it against
// the share's directory at a restore or rollback; the host directories
// themselves are not part of the snapshot and are not rolled back. The
// guest's paths go through the share's entries (v1, v2, …: ShareHostDir),
// so the shim records, beside the VM snapshot, which host directory each
// entry was (SharesName). An in-place rollback keeps the entries as they
// are; a restore (a checkpoint, a fork, a snapshot used as a template) binds
// the new container's host directories at the same entries, matched by the
// mount's destination, before cube-vmm restores: RestoreFrom.Shares.

// SharesName is the file in a VM snapshot directory that records the host
// directories shared with the VM when it was taken (absent: none).
const SharesName = "cube-shares.json"

// maxSharesFile bounds the file read from a snapshot.
const maxSharesFile = 1 << 20

// ShareRecord is one share entry of a snapshot: Name in the share
// ("v1"), the host directory, and the container mount it served. A
// restore's RestoreFrom.Shares are the same with the new host directory.
type ShareRecord struct {
	Name        string `json:"name"`
	Host        string `json:"host"`
	ReadOnly    bool   `json:"read_only"`
	Container   string `json:"container"`
	Destination string `json:"destination"`
	Ref         string `json:"ref"`
}

type sharesFile struct {
	Shares []ShareRecord `json:"shares"`
}

// shareRecords lists the shares now, as a snapshot records them.
func (s *Sandbox) shareRecords() []ShareRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	recs := make([]ShareRecord, 0, len(s.shared))
	for _, d := range s.shared {
		recs = append(recs, ShareRecord{Name: d.Name, Host: d.Host, ReadOnly: d.ReadOnly, Container: d.Container,
			Destination: d.Destination, Ref: d.Ref})
	}
	return recs
}

// writeShares records recs in the snapshot directory dir (nothing when
// there are none), under a temporary name renamed into place.
func writeShares(dir string, recs []ShareRecord) error {
	if len(recs) == 0 {
		return nil
	}
	b, err := json.MarshalIndent(sharesFile{Shares: recs}, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+SharesName+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("record the shared host directories in %s: %w", dir, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, SharesName)); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("record the shared host directories in %s: %w", dir, err)
	}
	return nil
}

// ReadShares reads the shares a VM snapshot directory records (nil when
// it has none). The file is checked as untrusted: entry names are the
// share's own (v<N>), paths absolute.
func ReadShares(dir string) ([]ShareRecord, error) {
	f, err := os.Open(filepath.Join(dir, SharesName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSharesFile+1))
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	bad := func(why string, args ...any) error {
		return fmt.Errorf("snapshot %s: %s: %s: take the snapshot again: %w", dir, SharesName, fmt.Sprintf(why, args...), errdefs.ErrFailedPrecondition)
	}
	if len(b) > maxSharesFile {
		return nil, bad("larger than %d bytes", maxSharesFile)
	}
	var sf sharesFile
	if err := json.Unmarshal(b, &sf); err != nil {
		return nil, bad("%v", err)
	}
	seen := map[string]bool{}
	for _, r := range sf.Shares {
		if shareSeqOf(r.Name) <= 0 || seen[r.Name] {
			return nil, bad("share entry %q is not v<N> or is repeated", r.Name)
		}
		seen[r.Name] = true
		if !path.IsAbs(r.Destination) || !filepath.IsAbs(r.Host) {
			return nil, bad("share %s: host %q and destination %q must be absolute", r.Name, r.Host, r.Destination)
		}
	}
	return sf.Shares, nil
}

// shareSeqOf is N of a share entry "vN" (0 when it is not one).
func shareSeqOf(name string) int {
	n, err := strconv.Atoi(strings.TrimPrefix(name, "v"))
	if err != nil || !strings.HasPrefix(name, "v") || n <= 0 || "v"+strconv.Itoa(n) != name {
		return 0
	}
	return n
}

// bindRestoredShares binds a restore's host directories at the entries
// the snapshot's guest knows, before cube-vmm re-opens its FUSE session
// against the share. Every share the snapshot recorded must be given
// (FailedPrecondition naming it, and the fix); the sandbox's share list
// and entry counter continue from them. Ordering: after prepareShare, before
// the VMM starts.
func (s *Sandbox) bindRestoredShares(snapDir string, binds []ShareRecord) error {
	recs, err := ReadShares(snapDir)
	if err != nil {
		return err
	}
	given := map[string]ShareRecord{}
	for _, b := range binds {
		given[b.Name] = b
	}
	var missing []string
	for _, r := range recs {
		if _, ok := given[r.Name]; !ok {
			missing = append(missing, fmt.Sprintf("%s (host %s at %s)", r.Ref, r.Host, r.Destination))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("sandbox %s: snapshot %s had host directories shared with its VM: %s; the new container's spec does not bind a host directory at those destinations: add them (a hostPath/PVC volume, or ctr --mount type=bind,src=DIR,dst=DEST,options=rbind): %w",
			s.o.ID, snapDir, strings.Join(missing, ", "), errdefs.ErrFailedPrecondition)
	}
	for _, r := range recs {
		b := given[r.Name]
		if err := bindHostDir(b.Host, filepath.Join(s.shareDir(), r.Name), b.ReadOnly); err != nil {
			return fmt.Errorf("sandbox %s: %s: bind host directory %s at share entry %s: %w", s.o.ID, b.Ref, b.Host, r.Name, err)
		}
		s.mu.Lock()
		s.shared = append(s.shared, SharedDir{Guest: path.Join(GuestShareRoot, r.Name), Host: b.Host, Ref: b.Ref,
			Name: r.Name, ReadOnly: b.ReadOnly, Container: b.Container, Destination: b.Destination})
		s.shareSeq = max(s.shareSeq, shareSeqOf(r.Name))
		s.mu.Unlock()
	}
	return nil
}
