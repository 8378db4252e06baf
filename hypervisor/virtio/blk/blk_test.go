package blk_test

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/virtio"
	"github.com/cube-runtime/cube/hypervisor/virtio/blk"
	"github.com/cube-runtime/cube/hypervisor/virtio/virtiotest"
)

const sectors = 64

func newDisk(t *testing.T, ro bool) (*virtiotest.Driver, *blk.Device, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "disk.img")
	img := make([]byte, sectors*blk.SectorSize+100) // a partial tail sector is not exposed
	for i := range img {
		img[i] = byte(i / blk.SectorSize)
	}
	if err := os.WriteFile(path, img, 0o644); err != nil {
		t.Fatal(err)
	}
	dev, err := blk.Open(blk.Options{Path: path, ReadOnly: ro, Serial: "cube-disk-0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	d := virtiotest.NewDriver(t, dev, nil)
	if st := d.Init(virtio.FVersion1|virtio.FRingIndirectDesc|blk.FFlush|blk.FSegMax|blk.FRO, 64); st != 0xF {
		t.Fatalf("status %#x", st)
	}
	return d, dev, path
}

// request builds header + data + status and returns (status gpa, data gpa).
func request(d *virtiotest.Driver, typ uint32, sector uint64, data []byte, dataLen int, indirect bool) (uint64, uint64) {
	hdr := d.Alloc(16)
	var h [16]byte
	binary.LittleEndian.PutUint32(h[0:], typ)
	binary.LittleEndian.PutUint64(h[8:], sector)
	d.Mem.Put(hdr, h[:])
	st := d.Alloc(1)
	d.Mem.Put(st, []byte{0xAA})
	bufs := []virtiotest.Desc{{Addr: hdr, Len: 16}}
	var buf uint64
	if data != nil {
		buf = d.Alloc(len(data))
		d.Mem.Put(buf, data)
		bufs = append(bufs, virtiotest.Desc{Addr: buf, Len: uint32(len(data))})
	} else if dataLen > 0 {
		// Split the data buffer in two descriptors to cover multi-segment requests.
		buf = d.Alloc(dataLen)
		half := uint32(dataLen / 2)
		bufs = append(bufs, virtiotest.Desc{Addr: buf, Len: half, Write: true},
			virtiotest.Desc{Addr: buf + uint64(half), Len: uint32(dataLen) - half, Write: true})
	}
	bufs = append(bufs, virtiotest.Desc{Addr: st, Len: 1, Write: true})
	if indirect {
		d.AddIndirect(0, bufs)
	} else {
		d.AddChain(0, bufs)
	}
	d.Kick(0)
	return st, buf
}

func status(d *virtiotest.Driver, st uint64) byte { return d.Mem.Bytes(st, 1)[0] }

func TestConfigSpace(t *testing.T) {
	d, dev, _ := newDisk(t, false)
	if got := binary.LittleEndian.Uint64(d.DeviceConfig(0, 8)); got != sectors || dev.Sectors() != sectors {
		t.Errorf("capacity %d", got)
	}
	if got := binary.LittleEndian.Uint32(d.DeviceConfig(0x0C, 4)); got != blk.SegMax {
		t.Errorf("seg_max %d", got)
	}
	if got := binary.LittleEndian.Uint32(d.DeviceConfig(0x14, 4)); got != 512 {
		t.Errorf("blk_size %d", got)
	}
	// Capacity read as two dwords (Linux's 64-bit config reads) is consistent.
	lo := binary.LittleEndian.Uint32(d.DeviceConfig(0, 4))
	hi := binary.LittleEndian.Uint32(d.DeviceConfig(4, 4))
	if uint64(hi)<<32|uint64(lo) != sectors {
		t.Error("split capacity read")
	}
}

func TestReadWriteFlushGetID(t *testing.T) {
	d, _, path := newDisk(t, false)
	// Read sectors 3..4.
	st, buf := request(d, blk.TypeIn, 3, nil, 1024, false)
	if status(d, st) != blk.StatusOK {
		t.Fatalf("read status %d", status(d, st))
	}
	got := d.Mem.Bytes(buf, 1024)
	if got[0] != 3 || got[511] != 3 || got[512] != 4 || got[1023] != 4 {
		t.Errorf("read data %v...", got[:4])
	}
	if u := d.PopUsed(0); len(u) != 1 || u[0].Len != 1025 {
		t.Errorf("used %+v", u)
	}
	// Write sector 10 through an indirect chain, check the file.
	payload := bytes.Repeat([]byte("cube"), 256)
	st, _ = request(d, blk.TypeOut, 10, payload, 0, true)
	if status(d, st) != blk.StatusOK {
		t.Fatalf("write status %d", status(d, st))
	}
	if u := d.PopUsed(0); len(u) != 1 || u[0].Len != 1 {
		t.Errorf("write used %+v", u)
	}
	file, _ := os.ReadFile(path)
	if !bytes.Equal(file[10*512:12*512], payload) || file[12*512] != 12 || file[10*512-1] != 9 {
		t.Error("file contents wrong after write")
	}
	// Flush.
	st, _ = request(d, blk.TypeFlush, 0, nil, 0, false)
	if status(d, st) != blk.StatusOK {
		t.Errorf("flush status %d", status(d, st))
	}
	// GET_ID into a 20-byte buffer.
	st, buf = request(d, blk.TypeGetID, 0, nil, 20, false)
	if status(d, st) != blk.StatusOK || string(bytes.TrimRight(d.Mem.Bytes(buf, 20), "\x00")) != "cube-disk-0" {
		t.Errorf("get id status %d data %q", status(d, st), d.Mem.Bytes(buf, 20))
	}
	// Unknown request type.
	st, _ = request(d, 99, 0, nil, 0, false)
	if status(d, st) != blk.StatusUnsupp {
		t.Errorf("unknown type status %d", status(d, st))
	}
	if n := d.MSI.Count(virtiotest.VectorData(0)); n < 5 {
		t.Errorf("%d interrupts", n)
	}
}

func TestErrorPaths(t *testing.T) {
	d, _, path := newDisk(t, false)
	before, _ := os.ReadFile(path)
	// Beyond capacity, straddling the end, sector overflow, partial sector.
	for _, tc := range []struct {
		typ    uint32
		sector uint64
		n      int
	}{
		{blk.TypeIn, sectors, 512},
		{blk.TypeIn, sectors - 1, 1024},
		{blk.TypeIn, ^uint64(0) / 256, 512},
		{blk.TypeIn, 0, 100},
		{blk.TypeOut, sectors - 1, 1024},
		{blk.TypeOut, ^uint64(0), 512},
	} {
		var st uint64
		if tc.typ == blk.TypeOut {
			st, _ = request(d, tc.typ, tc.sector, make([]byte, tc.n), 0, false)
		} else {
			st, _ = request(d, tc.typ, tc.sector, nil, tc.n, false)
		}
		if s := status(d, st); s != blk.StatusIOErr {
			t.Errorf("%+v: status %d, want IOERR", tc, s)
		}
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(before, after) {
		t.Error("failed writes changed the file")
	}
	// Header shorter than 16 bytes.
	hdr, st := d.Alloc(8), d.Alloc(1)
	d.AddChain(0, []virtiotest.Desc{{Addr: hdr, Len: 8}, {Addr: st, Len: 1, Write: true}})
	d.Kick(0)
	if s := status(d, st); s != blk.StatusIOErr {
		t.Errorf("short header status %d", s)
	}
	// Data buffer outside guest memory: IOERR, no panic, status still written.
	st2 := d.Alloc(1)
	h := d.Alloc(16)
	d.AddChain(0, []virtiotest.Desc{{Addr: h, Len: 16}, {Addr: 1 << 40, Len: 512, Write: true}, {Addr: st2, Len: 1, Write: true}})
	d.Kick(0)
	if s := status(d, st2); s == blk.StatusOK {
		t.Errorf("read into bad memory status %d", s)
	}
	// No writable byte at all: the chain is returned with length 0.
	d.PopUsed(0)
	d.AddChain(0, []virtiotest.Desc{{Addr: h, Len: 16}})
	d.Kick(0)
	if u := d.PopUsed(0); len(u) != 1 || u[0].Len != 0 {
		t.Errorf("no-status chain used %+v", u)
	}
}

func TestReadOnly(t *testing.T) {
	d, _, path := newDisk(t, true)
	d.Write(virtio.CommonOffset+0x08, 4, 0)
	if f := d.Read(virtio.CommonOffset+0x0C, 4); f&blk.FRO == 0 {
		t.Errorf("driver features %#x lack RO", f)
	}
	before, _ := os.ReadFile(path)
	st, _ := request(d, blk.TypeOut, 0, make([]byte, 512), 0, false)
	if s := status(d, st); s != blk.StatusIOErr {
		t.Errorf("write to read-only disk: status %d", s)
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(before, after) {
		t.Error("read-only disk changed")
	}
	st, buf := request(d, blk.TypeIn, 5, nil, 512, false)
	if status(d, st) != blk.StatusOK || d.Mem.Bytes(buf, 1)[0] != 5 {
		t.Error("read from read-only disk failed")
	}
}

func TestStateAndOpenErrors(t *testing.T) {
	_, dev, _ := newDisk(t, false)
	s := dev.State()
	if err := dev.Restore(s); err != nil {
		t.Fatal(err)
	}
	s.Sectors++
	if err := dev.Restore(s); err == nil {
		t.Error("capacity mismatch accepted")
	}
	if _, err := blk.Open(blk.Options{Path: "/nonexistent/disk"}); err == nil {
		t.Error("missing file accepted")
	}
	if _, err := blk.Open(blk.Options{Path: os.Args[0], Serial: "this serial is much too long"}); err == nil {
		t.Error("long serial accepted")
	}
}

func BenchmarkRead64K(b *testing.B) {
	path := filepath.Join(b.TempDir(), "disk.img")
	if err := os.WriteFile(path, make([]byte, 1<<20), 0o644); err != nil {
		b.Fatal(err)
	}
	dev, err := blk.Open(blk.Options{Path: path})
	if err != nil {
		b.Fatal(err)
	}
	defer dev.Close()
	d := virtiotest.NewDriver(b, dev, nil)
	d.Init(virtio.FVersion1, 64)
	hdr, data, st := d.Alloc(16), d.Alloc(64<<10), d.Alloc(1)
	b.SetBytes(64 << 10)
	for i := 0; i < b.N; i++ {
		d.AddChain(0, []virtiotest.Desc{{Addr: hdr, Len: 16}, {Addr: data, Len: 64 << 10, Write: true}, {Addr: st, Len: 1, Write: true}})
		d.Kick(0)
		d.PopUsed(0)
	}
}
