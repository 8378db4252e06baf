package blk_test

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/virtio"
	"github.com/cube-runtime/cube/hypervisor/virtio/blk"
	"github.com/cube-runtime/cube/hypervisor/virtio/virtiotest"
)

// FuzzRequest sends arbitrary request headers with arbitrary buffer layouts
// to one disk: no panic, the chain always comes back, a status byte is always
// one of OK/IOERR/UNSUPP, and the file never grows.
func FuzzRequest(f *testing.F) {
	path := filepath.Join(f.TempDir(), "disk.img")
	if err := os.WriteFile(path, make([]byte, 16*blk.SectorSize), 0o644); err != nil {
		f.Fatal(err)
	}
	dev, err := blk.Open(blk.Options{Path: path, Serial: "fuzz"})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { dev.Close() })
	d := virtiotest.NewDriver(f, dev, nil)
	if st := d.Init(virtio.FVersion1|virtio.FRingIndirectDesc, 64); st != 0xF {
		f.Fatalf("status %#x", st)
	}
	hdr, data, st, table := d.Alloc(16), d.Alloc(64<<10), d.Alloc(8), d.Alloc(64)
	f.Add(uint32(blk.TypeIn), uint64(0), uint32(512), uint32(1), false)
	f.Add(uint32(blk.TypeOut), uint64(15), uint32(1024), uint32(1), true)
	f.Add(uint32(blk.TypeGetID), uint64(0), uint32(20), uint32(1), false)
	f.Add(uint32(blk.TypeIn), ^uint64(0), uint32(512), uint32(0), false)
	f.Add(uint32(blk.TypeFlush), uint64(0), uint32(0), uint32(3), false)
	f.Fuzz(func(t *testing.T, typ uint32, sector uint64, dataLen, stLen uint32, indirect bool) {
		dataLen %= 64 << 10
		stLen %= 8
		var h [16]byte
		binary.LittleEndian.PutUint32(h[0:], typ)
		binary.LittleEndian.PutUint64(h[8:], sector)
		d.Mem.Put(hdr, h[:])
		d.Mem.Put(st, []byte{0xEE})
		descs := []virtiotest.Desc{{Addr: hdr, Len: 16}}
		if dataLen > 0 {
			descs = append(descs, virtiotest.Desc{Addr: data, Len: dataLen, Write: typ != blk.TypeOut})
		}
		if stLen > 0 {
			descs = append(descs, virtiotest.Desc{Addr: st, Len: stLen, Write: true})
		}
		if indirect {
			d.AddIndirectAt(0, table, descs)
		} else {
			d.AddChain(0, descs)
		}
		d.Kick(0)
		u := d.PopUsed(0)
		if len(u) != 1 {
			t.Fatalf("used %+v", u)
		}
		// The status is the last writable byte of the chain.
		if stLen > 0 {
			s := d.Mem.Bytes(st+uint64(stLen)-1, 1)[0]
			if s > blk.StatusUnsupp {
				t.Fatalf("status byte %d", s)
			}
		}
		if fi, err := os.Stat(path); err != nil || fi.Size() != 16*blk.SectorSize {
			t.Fatalf("disk size changed: %v %v", fi.Size(), err)
		}
	})
}
