package vsock_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/snapshot/snapshottest"
	"github.com/cube-runtime/cube/hypervisor/virtio/vsock"
)

// newDevice is a vsock device with no guest driver.
func newDevice(t testing.TB, cid uint64) *vsock.Device {
	t.Helper()
	dir, err := os.MkdirTemp("", "vsk") // short path: sun_path is 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	d, err := vsock.New(vsock.Options{GuestCID: cid, UDSPath: filepath.Join(dir, "v.sock")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestState(t *testing.T) {
	g := newGuest(t)
	g.hostConnect(61) // the next host port moves on
	snapshottest.RoundTrip(t, vsock.Kind, g.dev, newDevice(t, guestCID))
	snapshottest.Encoding(t, `{"Version":1,"GuestCID":3,"PendingEvent":true,"NextPort":1073741825}`, &vsock.State{})
	snapshottest.Encoding(t, `{"Version":1,"GuestCID":3,"PendingEvent":false}`, &vsock.State{}) // before NextPort
	snapshottest.Refusals(t, g.dev, `{"Version":2,"GuestCID":3}`)
	b, _ := g.dev.SaveState()
	if err := newDevice(t, guestCID+1).RestoreState(b); err == nil {
		t.Error("a state of another guest CID accepted")
	}
}

func FuzzRestoreState(f *testing.F) {
	snapshottest.Fuzz(f, newDevice(f, guestCID))
}
