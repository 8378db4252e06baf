package virtio

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"testing"
)

// flatMem is fake guest memory for the internal tests (virtiotest imports this
// package, so it cannot be used here).
type flatMem []byte

func (m flatMem) ReadAt(p []byte, gpa uint64) (int, error) {
	if gpa > uint64(len(m)) || uint64(len(p)) > uint64(len(m))-gpa {
		return 0, fmt.Errorf("out of range")
	}
	return copy(p, m[gpa:]), nil
}

func (m flatMem) WriteAt(p []byte, gpa uint64) (int, error) {
	if gpa > uint64(len(m)) || uint64(len(p)) > uint64(len(m))-gpa {
		return 0, fmt.Errorf("out of range")
	}
	return copy(m[gpa:], p), nil
}

const (
	fzDesc  = 0x0000
	fzAvail = 0x1000
	fzUsed  = 0x2000
	fzMem   = 0x10000
)

// fuzzQueue lays out a 16-entry queue whose descriptor table and avail ring
// come from the fuzzer's bytes; the rest of memory too, so indirect tables
// can point anywhere.
func fuzzQueue(data []byte, eventIdx bool) (*Queue, flatMem) {
	mem := make(flatMem, fzMem)
	copy(mem, data)
	// Keep the used ring ours so the check below is meaningful.
	for i := fzUsed; i < fzUsed+0x100; i++ {
		mem[i] = 0
	}
	q := NewQueue(16)
	q.Desc, q.Avail, q.Used, q.Ready, q.eventIdx = fzDesc, fzAvail, fzUsed, true, eventIdx
	q.mem = guestMem{mem: mem}
	return q, mem
}

// FuzzDescriptorChain feeds arbitrary descriptor tables, avail rings and
// indirect tables to the queue and checks: no panic, Pop terminates, every
// returned chain is bounded and well-ordered, used idx advances once per
// chain consumed, and reading/writing a chain stays within its buffers.
func FuzzDescriptorChain(f *testing.F) {
	seed := func(descs [][4]uint64, heads []uint16, availIdx uint16) []byte {
		b := make([]byte, fzAvail+64)
		for i, d := range descs {
			binary.LittleEndian.PutUint64(b[16*i:], d[0])
			binary.LittleEndian.PutUint32(b[16*i+8:], uint32(d[1]))
			binary.LittleEndian.PutUint16(b[16*i+12:], uint16(d[2]))
			binary.LittleEndian.PutUint16(b[16*i+14:], uint16(d[3]))
		}
		binary.LittleEndian.PutUint16(b[fzAvail+2:], availIdx)
		for i, h := range heads {
			binary.LittleEndian.PutUint16(b[fzAvail+4+2*i:], h)
		}
		return b
	}
	// A good two-descriptor chain.
	f.Add(seed([][4]uint64{{0x4000, 16, 1, 1}, {0x5000, 100, 2, 0}}, []uint16{0}, 1), false)
	// A loop.
	f.Add(seed([][4]uint64{{0x4000, 16, 1, 1}, {0x5000, 100, 1, 0}}, []uint16{0}, 1), false)
	// An indirect table pointing at the descriptor table itself.
	f.Add(seed([][4]uint64{{0, 64, 4, 0}, {0x5000, 8, 2, 0}}, []uint16{0, 1}, 2), true)
	// Head out of range, avail idx far ahead.
	f.Add(seed(nil, []uint16{99}, 1), false)
	f.Add(seed(nil, nil, 0x8000), true)
	// Buffer wrapping the address space.
	f.Add(seed([][4]uint64{{^uint64(0) - 4, 100, 2, 0}}, []uint16{0}, 1), false)
	f.Fuzz(func(t *testing.T, data []byte, eventIdx bool) {
		q, mem := fuzzQueue(data, eventIdx)
		consumed := 0
		for i := 0; i < 64; i++ {
			before := q.LastAvail
			c, err := q.Pop()
			if err != nil {
				if !errors.Is(err, ErrRing) {
					t.Fatalf("non-ring error %v", err)
				}
				break
			}
			consumed += int(q.LastAvail - before)
			if c == nil {
				break
			}
			if c.Head >= q.Size {
				t.Fatalf("head %d", c.Head)
			}
			if n := len(c.Readable) + len(c.Writable); n > int(q.Size)+MaxIndirect {
				t.Fatalf("chain of %d descriptors", n)
			}
			buf := make([]byte, 4096)
			r := c.Reader()
			for j := 0; j < 64; j++ {
				if _, err := r.Read(buf); err != nil {
					break
				}
			}
			w := c.Writer()
			_, _ = w.Write(buf[:min(len(buf), 300)])
			if w.Written() > c.WritableLen() {
				t.Fatalf("wrote %d > writable %d", w.Written(), c.WritableLen())
			}
			if err := q.PushUsed(c.Head, uint32(w.Written())); err != nil {
				t.Fatal(err)
			}
			q.NeedsInterrupt()
		}
		if consumed > 64*int(q.Size) {
			t.Fatalf("consumed %d entries", consumed)
		}
		if got := binary.LittleEndian.Uint16(mem[fzUsed+2:]); got != q.UsedIdx {
			t.Fatalf("used idx in memory %d, queue %d", got, q.UsedIdx)
		}
		if uint16(consumed) != q.UsedIdx {
			t.Fatalf("consumed %d avail entries but published %d used", consumed, q.UsedIdx)
		}
	})
}

func TestChainReaderWriterSpanBuffers(t *testing.T) {
	mem := make(flatMem, 0x10000)
	g := guestMem{mem: mem}
	c := &Chain{mem: g,
		Readable: []Buffer{{0x100, 3}, {0x200, 0}, {0x300, 5}},
		Writable: []Buffer{{0x400, 2}, {0x500, 4}}}
	copy(mem[0x100:], "abc")
	copy(mem[0x300:], "defgh")
	got, err := io.ReadAll(c.Reader())
	if err != nil || string(got) != "abcdefgh" {
		t.Fatalf("read %q %v", got, err)
	}
	w := c.Writer()
	n, err := w.Write([]byte("1234567"))
	if n != 6 || !errors.Is(err, ErrChainFull) {
		t.Fatalf("write %d %v", n, err)
	}
	if string(mem[0x400:0x402]) != "12" || string(mem[0x500:0x504]) != "3456" || w.Written() != 6 {
		t.Fatalf("written %q %q", mem[0x400:0x402], mem[0x500:0x504])
	}
}

func TestDirtyBitmap(t *testing.T) {
	d := NewDirtyBitmap(1 << 20)
	d.MarkDirty(4095, 2)
	d.MarkDirty(1<<20-1, 100) // partly beyond: ignored beyond the end
	d.MarkDirty(^uint64(0)-10, 100)
	d.MarkDirty(0x8000, 0)
	bm := d.Drain()
	if bm[0] != 0b11 {
		t.Errorf("word 0 %#b", bm[0])
	}
	if bm[3]>>63 != 1 {
		t.Errorf("last page not marked: %#x", bm[3])
	}
	if d.IsDirty(0) || d.IsDirty(255) {
		t.Error("drain did not clear")
	}
}

func BenchmarkPopPush(b *testing.B) {
	q, mem := fuzzQueue(nil, false)
	// One 2-descriptor chain at head 0, republished each iteration.
	binary.LittleEndian.PutUint64(mem[0:], 0x4000)
	binary.LittleEndian.PutUint32(mem[8:], 16)
	binary.LittleEndian.PutUint16(mem[12:], descFNext)
	binary.LittleEndian.PutUint16(mem[14:], 1)
	binary.LittleEndian.PutUint64(mem[16:], 0x5000)
	binary.LittleEndian.PutUint32(mem[24:], 512)
	binary.LittleEndian.PutUint16(mem[28:], descFWrite)
	for i := 0; i < b.N; i++ {
		binary.LittleEndian.PutUint16(mem[fzAvail+4+2*(i%16):], 0)
		binary.LittleEndian.PutUint16(mem[fzAvail+2:], uint16(i+1))
		c, err := q.Pop()
		if err != nil || c == nil {
			b.Fatal(err)
		}
		if err := q.PushUsed(c.Head, 512); err != nil {
			b.Fatal(err)
		}
	}
}
