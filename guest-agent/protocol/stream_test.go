package protocol

import (
	"bytes"
	"errors"
	"net"
	"strings"
	"testing"
)

func TestStreamHeaderRoundTrip(t *testing.T) {
	for _, h := range []StreamHeader{
		{ContainerID: "c1", Stream: Stdout},
		{ContainerID: "abc.def_g-1", ExecID: "e-2", Stream: Stdin},
		{ContainerID: "c1", ExecID: "e", Stream: Stderr, Reattach: true},
	} {
		line, err := h.Encode()
		if err != nil {
			t.Fatal(err)
		}
		got, err := ReadStreamHeader(bytes.NewReader(append(line, "payload"...)))
		if err != nil || got != h {
			t.Errorf("round trip of %+v: %+v, %v", h, got, err)
		}
	}
}

func TestStreamHeaderRejects(t *testing.T) {
	for _, line := range []string{
		"CUBE-STREAM 1 c - stdout again",
		"CUBE-STREAM 1 c - stdout reattach x",
		"", "CUBE-STREAM 1 c - stdout extra", "CUBE-STREAM 2 c - stdout", "HTTP/1.1 GET /",
		"CUBE-STREAM 1 ../etc - stdout", "CUBE-STREAM 1 c - stdlog", "CUBE-STREAM 1 - - stdout",
		"CUBE-STREAM 1 c " + strings.Repeat("x", 200) + " stdout",
	} {
		if h, err := ParseStreamHeader([]byte(line)); err == nil {
			t.Errorf("ParseStreamHeader(%q) = %+v, want error", line, h)
		}
	}
	if _, err := ReadStreamHeader(strings.NewReader(strings.Repeat("A", 10000))); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("endless header: %v", err)
	}
	if _, err := (StreamHeader{ContainerID: "c", Stream: "x"}).Encode(); err == nil {
		t.Error("Encode accepted an unknown stream")
	}
}

func TestOpenStreamReply(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	go func() {
		h, err := ReadStreamHeader(b)
		if err == nil && h.ContainerID == "ok" {
			WriteStreamReply(b, nil)
			b.Write([]byte("data"))
		} else {
			WriteStreamReply(b, errors.New("container \"bad\" not found\nsecond line"))
		}
		b.Close()
	}()
	if err := OpenStream(a, StreamHeader{ContainerID: "bad", Stream: Stdout}); err == nil || err.Error() != `container "bad" not found second line` {
		t.Fatalf("error reply: %v", err)
	}
}

func TestValidateID(t *testing.T) {
	for _, id := range []string{"a", "A-1.b_c", strings.Repeat("x", MaxIDLength)} {
		if err := ValidateID("container", id); err != nil {
			t.Errorf("%q: %v", id, err)
		}
	}
	for _, id := range []string{"", "-a", ".", "a/b", "a b", "a\x00", strings.Repeat("x", MaxIDLength+1)} {
		if err := ValidateID("container", id); err == nil {
			t.Errorf("%q accepted", id)
		}
	}
}

func FuzzParseStreamHeader(f *testing.F) {
	f.Add([]byte("CUBE-STREAM 1 c1 - stdout"))
	f.Add([]byte("CUBE-STREAM 1 c1 e1 stdin\n"))
	f.Add([]byte("CUBE-STREAM 1 c1 e1 stderr\nrest"))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := ReadStreamHeader(bytes.NewReader(data))
		if err != nil {
			return
		}
		// Anything accepted must re-encode to an equivalent header.
		line, err := h.Encode()
		if err != nil {
			t.Fatalf("accepted header %+v does not encode: %v", h, err)
		}
		h2, err := ParseStreamHeader(line)
		if err != nil || h2 != h {
			t.Fatalf("re-parse %q: %+v %v", line, h2, err)
		}
	})
}
