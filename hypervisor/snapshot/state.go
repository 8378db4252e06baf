package snapshot

import (
	"encoding/binary"
	"fmt"
	"io"
)

// State file layout (little-endian):
//
//	magic   [8]byte  "CUBESTAT"
//	version uint32   Version
//	length  uint32   payload bytes
//	payload [length]byte
//	crc     uint32   CRC-32C of everything before it
const (
	stateMagic    = "CUBESTAT"
	stateHeader   = 16
	stateOverhead = stateHeader + 4
	// MaxStateSize bounds the payload (vCPU state is ~20 KiB per vCPU).
	MaxStateSize = 64 << 20
)

// EncodeState frames payload as a state file.
func EncodeState(payload []byte) ([]byte, error) {
	if len(payload) > MaxStateSize {
		return nil, fmt.Errorf("state payload of %d bytes exceeds %d", len(payload), MaxStateSize)
	}
	b := make([]byte, stateHeader, stateOverhead+len(payload))
	copy(b, stateMagic)
	binary.LittleEndian.PutUint32(b[8:], Version)
	binary.LittleEndian.PutUint32(b[12:], uint32(len(payload)))
	b = append(b, payload...)
	return binary.LittleEndian.AppendUint32(b, stateCRC(b)), nil
}

// DecodeState checks a state file and returns its payload.
func DecodeState(b []byte) ([]byte, error) {
	if len(b) < stateOverhead {
		return nil, fmt.Errorf("state file of %d bytes: %w", len(b), ErrTruncated)
	}
	if string(b[:8]) != stateMagic {
		return nil, fmt.Errorf("state file: bad magic %q: %w", b[:8], ErrCorrupt)
	}
	if err := CheckVersion("state file", binary.LittleEndian.Uint32(b[8:])); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(b[12:])
	if n > MaxStateSize {
		return nil, fmt.Errorf("state payload length %d: %w", n, ErrCorrupt)
	}
	if int64(len(b)) < int64(stateOverhead)+int64(n) {
		return nil, fmt.Errorf("state file of %d bytes, header says %d: %w", len(b), int64(stateOverhead)+int64(n), ErrTruncated)
	}
	if int64(len(b)) > int64(stateOverhead)+int64(n) {
		return nil, fmt.Errorf("state file has %d trailing bytes: %w", int64(len(b))-int64(stateOverhead)-int64(n), ErrCorrupt)
	}
	end := stateHeader + int(n)
	if got, want := stateCRC(b[:end]), binary.LittleEndian.Uint32(b[end:]); got != want {
		return nil, fmt.Errorf("state file crc %#08x, recorded %#08x: %w", got, want, ErrChecksum)
	}
	return b[stateHeader:end], nil
}

// readBounded reads at most max bytes from r, failing if there are more.
func readBounded(r io.Reader, max int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("larger than %d bytes: %w", max, ErrCorrupt)
	}
	return b, nil
}
