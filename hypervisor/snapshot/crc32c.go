package snapshot

import (
	"hash/crc32"
	"sync"
)

// stateCRC is the CRC-32C (Castagnoli) that frames a state file.
//
// It does not use hash/crc32 for small inputs because of what its
// Castagnoli table costs to build: on amd64 MakeTable(Castagnoli) also
// fills the SSE4.2 tables (about 130,000 loop iterations). As a package
// variable that was half of a fresh cube-vmm's package initialization —
// 15 of 32 ms in the test host (TCG), paid by every restore and every
// boot. A state file is small (about 20 KiB per vCPU): up to
// smallCRCMax bytes a byte-wise 256-entry table (2,048 iterations to
// build, on first use) is cheaper in all; above it hash/crc32 is faster.
// Both compute the same function, so the file format does not change.
func stateCRC(b []byte) uint32 {
	if len(b) > smallCRCMax {
		return crc32.Checksum(b, castagnoliTable())
	}
	t := smallCastagnoli()
	crc := ^uint32(0)
	for _, c := range b {
		crc = t[byte(crc)^c] ^ crc>>8
	}
	return ^crc
}

// smallCRCMax is the largest input stateCRC checksums byte-wise.
const smallCRCMax = 256 << 10

var castagnoliTable = sync.OnceValue(func() *crc32.Table { return crc32.MakeTable(crc32.Castagnoli) })

var smallCastagnoli = sync.OnceValue(func() *[256]uint32 {
	var t [256]uint32
	for i := range t {
		crc := uint32(i)
		for range 8 {
			if crc&1 == 1 {
				crc = crc>>1 ^ crc32.Castagnoli
			} else {
				crc >>= 1
			}
		}
		t[i] = crc
	}
	return &t
})
