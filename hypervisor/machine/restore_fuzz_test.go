package machine

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/hypervisor/virtio"
)

// FuzzRestore feeds Restore a manifest and a state payload (the state file's
// framing and checksum are checkpoint's, fuzzed there): whatever they hold,
// Restore restores or refuses, never panics, and a refusal leaves nothing
// behind (descriptors, mappings of the snapshot's files). The memory layers
// the manifest names in the snapshot directory are made as sparse files of
// the sizes it gives, so inputs get past the files to the machine; prepared
// restores into a PreparedVM, as a standby VMM does.
func FuzzRestore(f *testing.F) {
	dir := rngSnapshot(f) // skips without KVM
	snap, err := snapshot.Open(dir)
	if err != nil {
		f.Fatal(err)
	}
	manifest, err := os.ReadFile(filepath.Join(dir, snapshot.ManifestName))
	if err != nil {
		f.Fatal(err)
	}
	twoVCPUs := *snap.Manifest
	twoVCPUs.Shape.VCPUs = 2
	two, err := json.Marshal(&twoVCPUs)
	if err != nil {
		f.Fatal(err)
	}
	diff := *snap.Manifest // a base and a diff layer, as an incremental snapshot has
	diff.Memory = append(diff.Memory, snapshot.MemoryLayer{File: "diff.bin", Size: diff.Memory[0].Size, Bitmap: "diff.bitmap"})
	layered, err := json.Marshal(&diff)
	if err != nil {
		f.Fatal(err)
	}
	s, err := snapshot.DecodePayload(snap.State)
	if err != nil {
		f.Fatal(err)
	}
	editQueue(f, &s.Devices[0], func(q *virtio.QueueState) { // a ready queue in guest RAM
		q.Ready, q.Size, q.Desc, q.Avail, q.Used = true, 64, 0x100000, 0x100400, 0x101000
	})
	ready, err := snapshot.EncodePayload(s)
	if err != nil {
		f.Fatal(err)
	}
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	for _, prepared := range []bool{false, true} {
		f.Add(manifest, snap.State, prepared)
		f.Add(two, snap.State, prepared)
		f.Add(layered, snap.State, prepared)
		f.Add(manifest, ready, prepared)
		f.Add(manifest, []byte(`{"Version":1,"VCPUs":[{"ID":0}]}`), prepared)
	}
	f.Fuzz(func(t *testing.T, manifest, state []byte, prepared bool) {
		man, err := snapshot.ParseManifest(manifest)
		if err != nil {
			return // checkpoint's FuzzParseManifest covers the refusals
		}
		// The harness's own bounds: the files and vCPUs it makes per input.
		if man.Shape.MemoryMiB > 256 || man.Shape.VCPUs > 8 || len(man.Memory) > 4 {
			return
		}
		dir := filepath.Join(t.TempDir(), "snap")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, l := range man.Memory {
			makeSparse(t, dir, l.File, l.Size)
			if l.Bitmap != "" {
				makeSparse(t, dir, l.Bitmap, snapshot.BitmapBytes(l.Size))
			}
		}
		restoreAndClose(t, &snapshot.Snapshot{Dir: dir, Manifest: man, State: state}, Config{Log: logrus.NewEntry(quiet)}, prepared)
	})
}

// makeSparse makes dir/name a file of size zero bytes, if name is a plain
// file name (a parent's layer, ../other/name, stays missing).
func makeSparse(t *testing.T, dir, name string, size int64) {
	t.Helper()
	if strings.Contains(name, "/") {
		return
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err == nil {
		return
	}
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, size); err != nil {
		t.Fatal(err)
	}
}
