package snapshot

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

func TestStateCRCKnownValue(t *testing.T) {
	// The CRC-32C check value (RFC 3720, B.4).
	if got := stateCRC([]byte("123456789")); got != 0xe3069283 {
		t.Fatalf("stateCRC(123456789) = %#08x, want 0xe3069283", got)
	}
}

// stateCRC must equal hash/crc32's Castagnoli on both of its paths, or old state files stop decoding.
func TestStateCRCMatchesHashCRC32(t *testing.T) {
	tab := crc32.MakeTable(crc32.Castagnoli)
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 7, 8, 63, 4096, 20 << 10, smallCRCMax - 1, smallCRCMax, smallCRCMax + 1, 1 << 20} {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		if got, want := stateCRC(b), crc32.Checksum(b, tab); got != want {
			t.Errorf("%d bytes: stateCRC %#08x, hash/crc32 %#08x", n, got, want)
		}
	}
}

func FuzzStateCRC(f *testing.F) {
	f.Add([]byte("CUBESTAT"))
	tab := crc32.MakeTable(crc32.Castagnoli)
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := stateCRC(b), crc32.Checksum(b, tab); got != want {
			t.Fatalf("stateCRC %#08x, hash/crc32 %#08x", got, want)
		}
	})
}
