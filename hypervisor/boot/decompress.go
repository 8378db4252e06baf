package boot

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Setup header fields locating the compressed kernel (protocol 2.08+),
// relative to the start of the protected-mode code.
const (
	offPayloadOffset = 0x248
	offPayloadLength = 0x24c

	lz4LegacyMagic = 0x184c2102
	maxVmlinux     = 512 << 20
)

// ErrUnsupportedCompression means the bzImage payload uses a format we do
// not decompress on the host; the guest's own decompressor still works.
var ErrUnsupportedCompression = errors.New("unsupported kernel payload compression")

// DecompressBzImage extracts the ELF vmlinux from a bzImage's compressed
// payload (LZ4 legacy frames, as Debian builds it, or gzip) and returns it
// ready to load at its link-time physical addresses, with the bzImage's
// setup header for the zero page. Booting it skips the in-guest
// decompressor, which is a large share of boot time when guest code runs
// slowly; the kernel then runs where it was linked (no KASLR).
func DecompressBzImage(img []byte) (*Kernel, error) {
	k, _, err := DecompressBzImageELF(img)
	return k, err
}

// DecompressBzImageELF is DecompressBzImage that also returns the ELF
// bytes, for callers that cache them (see WithSetupOf).
func DecompressBzImageELF(img []byte) (*Kernel, []byte, error) {
	bz, err := ParseBzImage(img)
	if err != nil {
		return nil, nil, err
	}
	if bz.Version < 0x0208 {
		return nil, nil, fmt.Errorf("boot protocol %#x has no payload fields", bz.Version)
	}
	pm := bz.Segments[0].Data
	off, n := uint64(le.Uint32(img[offPayloadOffset:])), uint64(le.Uint32(img[offPayloadLength:]))
	if off > uint64(len(pm)) || n > uint64(len(pm))-off || n < 8 {
		return nil, nil, fmt.Errorf("bzImage payload [%#x,+%#x) outside the image", off, n)
	}
	payload := pm[off : off+n]
	var elfImg []byte
	switch {
	case le.Uint32(payload) == lz4LegacyMagic:
		elfImg, err = unlz4Legacy(payload)
	case payload[0] == 0x1f && payload[1] == 0x8b:
		elfImg, err = gunzip(payload)
	default:
		return nil, nil, fmt.Errorf("%w (magic % x)", ErrUnsupportedCompression, payload[:4])
	}
	if err != nil {
		return nil, nil, fmt.Errorf("decompress kernel payload: %w", err)
	}
	k, err := WithSetupOf(elfImg, bz)
	return k, elfImg, err
}

// WithSetupOf parses a vmlinux ELF (e.g. a cached decompression of bz)
// and gives it bz's setup header and limits for the zero page.
func WithSetupOf(elfImg []byte, bz *Kernel) (*Kernel, error) {
	k, err := ParseVmlinux(elfImg)
	if err != nil {
		return nil, err
	}
	k.Setup = bz.Setup
	k.InitrdAddrMax, k.CmdlineSize, k.Version = bz.InitrdAddrMax, bz.CmdlineSize, bz.Version
	return k, nil
}

func gunzip(p []byte) ([]byte, error) {
	r, err := gzip.NewReader(bytes.NewReader(p))
	if err != nil {
		return nil, err
	}
	out, err := io.ReadAll(io.LimitReader(r, maxVmlinux+1))
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, err
	}
	if len(out) > maxVmlinux {
		return nil, fmt.Errorf("decompressed kernel exceeds %d bytes", maxVmlinux)
	}
	return out, nil
}

// unlz4Legacy decodes the LZ4 legacy frame format (magic, then blocks
// each prefixed by its compressed size) as the kernel's build writes it,
// followed by the 4-byte uncompressed size the build appends.
func unlz4Legacy(p []byte) ([]byte, error) {
	want := int(binary.LittleEndian.Uint32(p[len(p)-4:]))
	if want <= 0 || want > maxVmlinux {
		return nil, fmt.Errorf("lz4: implausible uncompressed size %d", want)
	}
	out := make([]byte, 0, want)
	rest := p
	for len(rest) >= 4 {
		n := binary.LittleEndian.Uint32(rest)
		if n == lz4LegacyMagic {
			rest = rest[4:]
			continue
		}
		if uint64(n) > uint64(len(rest)-4) {
			if len(rest) == 4 {
				break // the appended size trailer
			}
			return nil, fmt.Errorf("lz4: block of %d bytes with %d left", n, len(rest)-4)
		}
		var err error
		if out, err = lz4Block(out, rest[4:4+n], want); err != nil {
			return nil, err
		}
		rest = rest[4+n:]
	}
	if len(out) != want {
		return nil, fmt.Errorf("lz4: decoded %d bytes, trailer says %d", len(out), want)
	}
	return out, nil
}

// lz4Block appends one decoded LZ4 block to dst, never growing it past
// limit.
func lz4Block(dst, src []byte, limit int) ([]byte, error) {
	i := 0
	length := func(n int) (int, error) {
		if n != 15 {
			return n, nil
		}
		for {
			if i >= len(src) {
				return 0, errors.New("lz4: truncated length")
			}
			b := src[i]
			i++
			n += int(b)
			if n > limit {
				return 0, errors.New("lz4: length exceeds output")
			}
			if b != 255 {
				return n, nil
			}
		}
	}
	for i < len(src) {
		token := src[i]
		i++
		lit, err := length(int(token >> 4))
		if err != nil {
			return nil, err
		}
		if lit > len(src)-i || len(dst)+lit > limit {
			return nil, errors.New("lz4: literals overrun")
		}
		dst = append(dst, src[i:i+lit]...)
		i += lit
		if i == len(src) {
			break // the last sequence has literals only
		}
		if i+2 > len(src) {
			return nil, errors.New("lz4: truncated offset")
		}
		off := int(src[i]) | int(src[i+1])<<8
		i += 2
		if off == 0 || off > len(dst) {
			return nil, fmt.Errorf("lz4: bad match offset %d", off)
		}
		ml, err := length(int(token & 15))
		if err != nil {
			return nil, err
		}
		ml += 4
		if len(dst)+ml > limit {
			return nil, errors.New("lz4: match overruns output")
		}
		// Byte by byte: matches may overlap their own output.
		start := len(dst) - off
		for k := 0; k < ml; k++ {
			dst = append(dst, dst[start+k])
		}
	}
	return dst, nil
}
