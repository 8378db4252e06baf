package fs_test

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/hypervisor/virtio"
	"github.com/cube-runtime/cube/hypervisor/virtio/fs"
	"github.com/cube-runtime/cube/hypervisor/virtio/virtiotest"
)

func openShare(t *testing.T, dir string) (*virtiotest.Driver, *fs.Device) {
	t.Helper()
	dev, err := fs.Open(fs.Options{Tag: "share0", Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	d := virtiotest.NewDriver(t, dev, nil)
	if st := d.Init(virtio.FVersion1|virtio.FRingIndirectDesc, 64); st != 0xF {
		t.Fatalf("status %#x", st)
	}
	return d, dev
}

func req(op uint32, node, unique uint64, body []byte) []byte {
	b := make([]byte, 40, 40+len(body))
	binary.LittleEndian.PutUint32(b[0:], uint32(40+len(body)))
	binary.LittleEndian.PutUint32(b[4:], op)
	binary.LittleEndian.PutUint64(b[8:], unique)
	binary.LittleEndian.PutUint64(b[16:], node)
	return append(b, body...)
}

// roundTrip puts a request on queue q split over two readable descriptors
// and returns the reply from a writable buffer of replyLen bytes.
func roundTrip(t *testing.T, d *virtiotest.Driver, q int, request []byte, replyLen int) []byte {
	t.Helper()
	in := d.Alloc(len(request))
	d.Mem.Put(in, request)
	half := uint32(len(request) / 2)
	bufs := []virtiotest.Desc{{Addr: in, Len: half}, {Addr: in + uint64(half), Len: uint32(len(request)) - half}}
	var outAddr uint64
	if replyLen > 0 {
		outAddr = d.Alloc(replyLen)
		bufs = append(bufs, virtiotest.Desc{Addr: outAddr, Len: uint32(replyLen), Write: true})
	}
	head := d.AddChain(q, bufs)
	d.Kick(q)
	used := d.PopUsed(q)
	if len(used) != 1 || used[0].ID != uint32(head) {
		t.Fatalf("used %+v, want head %d", used, head)
	}
	return d.Mem.Bytes(outAddr, int(used[0].Len))
}

// TestDeviceConfigAndRequests: the tag is in config space, INIT/LOOKUP go
// through the request queue, FORGET through hiprio without a reply, and a
// snapshot while mounted carries the session (restored in place, the
// looked-up node answers GETATTR) while one after DESTROY has none.
func TestDeviceConfigAndRequests(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hello"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, dev := openShare(t, dir)
	cfg := d.DeviceConfig(0, 40)
	if string(cfg[:6]) != "share0" || cfg[6] != 0 || binary.LittleEndian.Uint32(cfg[36:]) != 1 {
		t.Fatalf("config space %q", cfg)
	}
	if _, err := dev.SaveState(); err != nil {
		t.Fatalf("snapshot before mount: %v", err)
	}
	initIn := make([]byte, 64)
	binary.LittleEndian.PutUint32(initIn[0:], 7)
	binary.LittleEndian.PutUint32(initIn[4:], 38)
	r := roundTrip(t, d, 1, req(26, 0, 1, initIn), 16+64)
	if len(r) != 80 || binary.LittleEndian.Uint32(r[4:]) != 0 || binary.LittleEndian.Uint32(r[16:]) != 7 {
		t.Fatalf("INIT reply %x", r)
	}
	r = roundTrip(t, d, 1, req(1, 1, 2, []byte("hello\x00")), 16+128)
	if len(r) != 144 || binary.LittleEndian.Uint32(r[4:]) != 0 || binary.LittleEndian.Uint64(r[16+40+8:]) != 2 {
		t.Fatalf("LOOKUP reply %x", r)
	}
	node := binary.LittleEndian.Uint64(r[16:])
	mounted, err := dev.SaveState()
	if err != nil {
		t.Fatalf("snapshot while mounted: %v", err)
	}
	if !strings.Contains(string(mounted), `"Session":{"Initialized":true`) || !strings.Contains(string(mounted), `"Path":"hello"`) {
		t.Fatalf("snapshot while mounted does not carry the session: %s", mounted)
	}
	// FORGET on hiprio: used length 0.
	forget := make([]byte, 8)
	binary.LittleEndian.PutUint64(forget, 1)
	if r := roundTrip(t, d, 0, req(2, node, 3, forget), 0); len(r) != 0 {
		t.Fatalf("FORGET reply %x", r)
	}
	// A reply buffer too small for the entry: truncated, never overrun.
	r = roundTrip(t, d, 1, req(1, 1, 4, []byte("hello\x00")), 20)
	if len(r) != 20 {
		t.Fatalf("short reply buffer: %d bytes used", len(r))
	}
	roundTrip(t, d, 1, req(38, 1, 5, nil), 16)
	st, err := dev.SaveState()
	if err != nil {
		t.Fatalf("snapshot after DESTROY: %v", err)
	}
	// Restore: same tag and mode only.
	other, err := fs.Open(fs.Options{Tag: "other", Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.RestoreState(st); err == nil {
		t.Errorf("restore onto another tag succeeded")
	}
	if err := dev.RestoreState(st); err != nil {
		t.Errorf("restore: %v", err)
	}
	// The mounted snapshot restored in place: the node LOOKUP gave is
	// served again (GETATTR), the unmounted one's session is not.
	if err := dev.RestoreState(mounted); err != nil {
		t.Fatalf("restore of the mounted snapshot: %v", err)
	}
	r = roundTrip(t, d, 1, req(3, node, 6, make([]byte, 16)), 16+104)
	if len(r) != 120 || binary.LittleEndian.Uint32(r[4:]) != 0 {
		t.Fatalf("GETATTR of node %d after the restore: %x", node, r)
	}
	if err := other.RestoreState(mounted); !errors.Is(err, snapshot.ErrMismatch) {
		t.Errorf("restore of a mounted snapshot onto another tag: %v, want ErrMismatch", err)
	}
}

func TestOpenRefusesBadTag(t *testing.T) {
	for _, tag := range []string{"", string(make([]byte, 37))} {
		if _, err := fs.Open(fs.Options{Tag: tag, Dir: t.TempDir()}); err == nil {
			t.Errorf("tag of %d bytes accepted", len(tag))
		}
	}
	if _, err := fs.Open(fs.Options{Tag: "t", Dir: "/nonexistent/dir"}); err == nil {
		t.Errorf("missing directory accepted")
	}
}

// TestDeviceRollbackInPlace: a mounted share's device and transport states
// restored onto the same, active device (an in-place rollback: the
// transport's restore resets and re-activates the device after the device's
// own restore) keep the guest's session: the looked-up node still answers.
func TestDeviceRollbackInPlace(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hello"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, dev := openShare(t, dir)
	initIn := make([]byte, 64)
	binary.LittleEndian.PutUint32(initIn[0:], 7)
	binary.LittleEndian.PutUint32(initIn[4:], 38)
	roundTrip(t, d, 1, req(26, 0, 1, initIn), 16+64)
	r := roundTrip(t, d, 1, req(1, 1, 2, []byte("hello\x00")), 16+128)
	node := binary.LittleEndian.Uint64(r[16:])
	d.Tr.Pause()
	trState := d.Tr.State()
	devState, err := dev.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.RestoreState(devState); err != nil {
		t.Fatal(err)
	}
	if err := d.Tr.Restore(trState); err != nil {
		t.Fatal(err)
	}
	d.Tr.Resume()
	r = roundTrip(t, d, 1, req(3, node, 3, make([]byte, 16)), 16+104)
	if len(r) != 120 || binary.LittleEndian.Uint32(r[4:]) != 0 {
		t.Fatalf("GETATTR of node %d after an in-place rollback: errno %d (%d bytes)", node, int32(binary.LittleEndian.Uint32(r[4:])), len(r))
	}
	// A reset by the guest afterwards ends the session as before.
	dev.Reset()
	if dev.Server().Mounted() {
		t.Errorf("a guest reset after the rollback kept the session")
	}
}
