package blk_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/snapshot/snapshottest"
	"github.com/cube-runtime/cube/hypervisor/virtio/blk"
)

// openDisk opens a device over path, or a fresh image of n sectors.
func openDisk(t testing.TB, path string, n int) *blk.Device {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "disk.img")
		if err := os.WriteFile(path, make([]byte, n*blk.SectorSize), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d, err := blk.Open(blk.Options{Path: path, Serial: "cube-disk-0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestState(t *testing.T) {
	_, dev, path := newDisk(t, false)
	// The path and serial are the device's own (a restore opens a working
	// copy wherever it likes): the state only has to match them.
	snapshottest.RoundTrip(t, blk.Kind, dev, openDisk(t, path, 0))
	snapshottest.Encoding(t, `{"Version":1,"Path":"/img/root.img","ReadOnly":true,"Serial":"root","Sectors":64}`, &blk.State{})
	snapshottest.Refusals(t, dev, `{"Version":2,"Sectors":64}`)
	// Another capacity: the guest has this one cached.
	b, _ := dev.SaveState()
	if err := openDisk(t, "", sectors+1).RestoreState(b); err == nil {
		t.Error("a state of another capacity accepted")
	}
}

func FuzzRestoreState(f *testing.F) {
	snapshottest.Fuzz(f, openDisk(f, "", sectors))
}
