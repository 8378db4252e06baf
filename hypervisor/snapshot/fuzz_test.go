package snapshot

import (
	"testing"
)

func FuzzParseManifest(f *testing.F) {
	b, _ := marshalManifest(func() *Manifest {
		m := testManifest()
		m.FormatVersion = Version
		m.State = StateFile{File: StateName, Size: 100}
		return m
	}())
	f.Add(b)
	f.Add([]byte(`{"format_version":1}`))
	f.Add([]byte(`{"format_version":2}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseManifest(b)
		if err != nil {
			return
		}
		// Whatever parses must name only files inside the snapshot (or a
		// sibling's memory layers) and be re-encodable.
		for _, d := range m.Shape.Disks {
			if d.File != "" && localName(d.File) != nil {
				t.Fatalf("accepted disk file %q", d.File)
			}
		}
		if _, err := marshalManifest(m); err != nil {
			t.Fatal(err)
		}
	})
}

func FuzzDecodeState(f *testing.F) {
	good, _ := EncodeState([]byte(`{"vcpus":[]}`))
	f.Add(good)
	f.Add(good[:10])
	f.Add([]byte("CUBESTAT\x01\x00\x00\x00\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := DecodeState(b)
		if err != nil {
			return
		}
		again, err := EncodeState(p)
		if err != nil || string(again) != string(b) {
			t.Fatalf("accepted state does not re-encode to itself")
		}
	})
}

func FuzzRuns(f *testing.F) {
	f.Add(uint64(0b1011), uint64(1<<63), int64(128))
	f.Fuzz(func(t *testing.T, a, b uint64, pages int64) {
		words := []uint64{a, b}
		var n int64
		for _, r := range Runs(words, pages) {
			if r[0] >= r[1] || r[1] > 128 {
				t.Fatalf("bad run %v", r)
			}
			n += r[1] - r[0]
		}
		if pages >= 128 {
			want := int64(0)
			for _, w := range words {
				for ; w != 0; w &= w - 1 {
					want++
				}
			}
			if n != want {
				t.Fatalf("runs cover %d pages, bitmap has %d", n, want)
			}
		}
	})
}
