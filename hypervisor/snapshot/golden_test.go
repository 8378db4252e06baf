package snapshot_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/hypervisor/snapshot/snapshottest"
)

// TestGolden: the golden snapshots of the current format version open, and
// every file the format defines decodes and encodes again to exactly its
// bytes — manifest, state file, state payload, bitmap. A change that alters
// how any of them is encoded fails here: that change is a snapshot.Version
// bump (version.go says when), with a new golden (testdata/v<N>, made by
// go test ./hypervisor/vmmcmd -run TestGolden -update). The devices' states
// inside the payload are checked the same way by the machine's golden test,
// cube-vmm's configuration by vmmcmd's.
func TestGolden(t *testing.T) {
	dir := snapshottest.Golden(t, snapshot.Version)
	full := open(t, filepath.Join(dir, snapshottest.Full))
	diff := open(t, filepath.Join(dir, snapshottest.Diff))
	for _, s := range []*snapshot.Snapshot{full, diff} {
		name := filepath.Base(s.Dir)
		raw := read(t, s.Path(snapshot.ManifestName))
		m, err := snapshot.ParseManifest(raw)
		if err != nil {
			t.Fatal(err)
		}
		same(t, name+" manifest", raw, must(snapshot.MarshalManifest(m)))
		raw = read(t, s.Path(snapshot.StateName))
		payload, err := snapshot.DecodeState(raw)
		if err != nil {
			t.Fatal(err)
		}
		same(t, name+" state file", raw, must(snapshot.EncodeState(payload)))
		st, err := snapshot.DecodePayload(payload)
		if err != nil {
			t.Fatal(err)
		}
		same(t, name+" state payload", payload, must(snapshot.EncodePayload(st)))

		// What the golden is: one vCPU, a disk, vsock and rng, and the
		// version fields all holding the format version.
		if m.FormatVersion != snapshot.Version || st.Version != snapshot.Version || m.Components.VMMVersion != snapshot.VMMVersion() {
			t.Errorf("%s: format version %d, state version %d, VMM version %q", name, m.FormatVersion, st.Version, m.Components.VMMVersion)
		}
		var kinds []string
		for _, d := range st.Devices {
			kinds = append(kinds, d.Kind)
		}
		if len(st.VCPUs) != 1 || !slices.Equal(kinds, []string{"blk", "vsock", "rng"}) || m.Shape.Disks[0].File != snapshot.DiskName(0) {
			t.Errorf("%s: %d vCPUs, devices %v, disk copy %q", name, len(st.VCPUs), kinds, m.Shape.Disks[0].File)
		}
	}
	// The incremental one: its parent's layer named from beside it, and its
	// own with a bitmap that encodes to its file's bytes.
	inherited, err := full.ChildLayers()
	if err != nil {
		t.Fatal(err)
	}
	layers := diff.Manifest.Memory
	if len(layers) != 2 || layers[0] != inherited[0] || layers[1].File != snapshot.MemoryName || layers[1].Bitmap != snapshot.BitmapName {
		t.Fatalf("incremental golden's layers %+v", layers)
	}
	bm, err := diff.Bitmap(1)
	if err != nil {
		t.Fatal(err)
	}
	same(t, "bitmap", read(t, diff.Path(snapshot.BitmapName)), snapshot.EncodeBitmap(bm))
}

// TestGoldenVersions: testdata has a golden for the current version and for
// none after it, and a snapshot of an older version is refused as such (a
// build reads only its own version), not misread.
func TestGoldenVersions(t *testing.T) {
	versions, err := snapshottest.Versions()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(versions, snapshot.Version) {
		t.Fatalf("snapshot.Version is %d but testdata has golden snapshots of versions %v only: "+
			"make one with go test ./hypervisor/vmmcmd -run TestGolden -update", snapshot.Version, versions)
	}
	for _, v := range versions {
		switch {
		case v > snapshot.Version:
			t.Errorf("testdata has a golden of version %d, after this build's %d", v, snapshot.Version)
		case v < snapshot.Version:
			dir := snapshottest.Golden(t, v)
			if _, err := snapshot.Open(filepath.Join(dir, snapshottest.Full)); !errors.Is(err, snapshot.ErrVersion) {
				t.Errorf("a version %d snapshot: %v, want ErrVersion", v, err)
			}
		}
	}
}

func open(t *testing.T, dir string) *snapshot.Snapshot {
	t.Helper()
	s, err := snapshot.Open(dir)
	if err != nil {
		t.Fatalf("the golden snapshot of format version %d does not open: %v", snapshot.Version, err)
	}
	return s
}

func read(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// same fails the test if the golden's bytes and their re-encoding differ,
// showing where.
func same(t *testing.T, what string, golden, again []byte) {
	t.Helper()
	if bytes.Equal(golden, again) {
		return
	}
	i := 0
	for i < len(golden) && i < len(again) && golden[i] == again[i] {
		i++
	}
	lo := max(i-60, 0)
	t.Errorf("the golden %s re-encodes differently from byte %d:\n golden: …%q…\n now:    …%q…\n"+
		"Changing how a snapshot is encoded is a snapshot.Version bump (version.go says when).",
		what, i, golden[lo:min(i+60, len(golden))], again[lo:min(i+60, len(again))])
}
