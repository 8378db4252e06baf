package boot

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"os"
	"testing"
)

func TestLZ4Block(t *testing.T) {
	cases := []struct {
		src  []byte
		want string
	}{
		{[]byte{0x50, 'h', 'e', 'l', 'l', 'o'}, "hello"},
		{[]byte{0x10, 'a', 0x01, 0x00}, "aaaaa"},                                    // overlapping match
		{[]byte{0x2f, 'a', 'b', 0x02, 0x00, 0x03}, "ab" + "ababababababababababab"}, // 15+3+4 = 22
	}
	for _, c := range cases {
		got, err := lz4Block(nil, c.src, 1<<20)
		if err != nil || string(got) != c.want {
			t.Errorf("%x: %q %v, want %q", c.src, got, err, c.want)
		}
	}
	for name, src := range map[string][]byte{
		"offset 0":        {0x10, 'a', 0x00, 0x00},
		"offset too far":  {0x10, 'a', 0x05, 0x00},
		"literal overrun": {0x50, 'a'},
		"truncated len":   {0xf0},
	} {
		if _, err := lz4Block(nil, src, 1<<20); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := lz4Block(nil, []byte{0x10, 'a', 0x01, 0x00}, 3); err == nil {
		t.Error("output limit not enforced")
	}
}

func TestUnlz4LegacyFrame(t *testing.T) {
	block := []byte{0x50, 'h', 'e', 'l', 'l', 'o'}
	var p []byte
	p = binary.LittleEndian.AppendUint32(p, lz4LegacyMagic)
	for i := 0; i < 2; i++ {
		p = binary.LittleEndian.AppendUint32(p, uint32(len(block)))
		p = append(p, block...)
	}
	p = binary.LittleEndian.AppendUint32(p, 10) // size trailer
	got, err := unlz4Legacy(p)
	if err != nil || string(got) != "hellohello" {
		t.Fatalf("%q %v", got, err)
	}
	p[len(p)-4] = 11
	if _, err := unlz4Legacy(p); err == nil {
		t.Error("size mismatch accepted")
	}
}

func TestDecompressGzipPayload(t *testing.T) {
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	w.Write([]byte("not an elf"))
	w.Close()
	pay := gz.Bytes()
	img := fakeBzImage(1, pay)
	le.PutUint32(img[offPayloadOffset:], 0)
	le.PutUint32(img[offPayloadLength:], uint32(len(pay)))
	// Decompression works; the result is not an ELF, which must be an error, not a panic.
	if _, err := DecompressBzImage(img); err == nil {
		t.Error("non-ELF payload accepted")
	}
	le.PutUint32(img[offPayloadLength:], uint32(len(pay)+100))
	if _, err := DecompressBzImage(img); err == nil {
		t.Error("payload past the image accepted")
	}
}

// TestDecompressRealKernel decompresses a real bzImage when CUBE_TEST_KERNEL names one.
func TestDecompressRealKernel(t *testing.T) {
	p := os.Getenv("CUBE_TEST_KERNEL")
	if p == "" {
		t.Skip("CUBE_TEST_KERNEL not set: no real kernel image to decompress")
	}
	img, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	k, err := DecompressBzImage(img)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("entry %#x, %d segments, end %#x, setup header %d bytes", k.Entry, len(k.Segments), k.End, len(k.Setup))
	if k.Entry < 0x100000 || len(k.Setup) == 0 {
		t.Errorf("kernel %+v", k)
	}
}

func FuzzUnlz4(f *testing.F) {
	f.Add([]byte{0x02, 0x21, 0x4c, 0x18, 6, 0, 0, 0, 0x50, 'h', 'e', 'l', 'l', 'o', 5, 0, 0, 0})
	f.Fuzz(func(t *testing.T, p []byte) {
		if len(p) < 8 {
			return
		}
		out, err := unlz4Legacy(p)
		if err == nil && len(out) != int(binary.LittleEndian.Uint32(p[len(p)-4:])) {
			t.Fatalf("decoded %d bytes against trailer", len(out))
		}
	})
}
