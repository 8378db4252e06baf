package protocol

import (
	"errors"
	"fmt"
	"io"
	"strings"
)

// Stream names one standard stream of a process.
type Stream string

const (
	Stdin  Stream = "stdin"
	Stdout Stream = "stdout"
	Stderr Stream = "stderr"
)

const (
	streamMagic = "CUBE-STREAM"
	// maxHeaderLine bounds the header so a bad peer cannot make the agent
	// buffer without limit.
	maxHeaderLine = 2*MaxIDLength + 64
	noExec        = "-"
	reattachFlag  = "reattach"
)

// StreamHeader opens a stdio stream: "CUBE-STREAM 1 <container> <exec|-> <stream>\n",
// or, re-attaching, "CUBE-STREAM 1 <container> <exec|-> <stream> reattach\n".
type StreamHeader struct {
	ContainerID string
	ExecID      string // empty: the container's init process
	Stream      Stream
	// Reattach replaces the stream's connection when it has one: after a
	// rollback or restore every vsock connection was reset (the transport
	// reset), and the host connects the process's streams again. Without it,
	// a second connection for a stream is refused.
	Reattach bool
}

// ValidateID checks a container or exec id: 1..MaxIDLength characters from
// [A-Za-z0-9._-], starting with a letter or digit. Ids become path and
// header components, so nothing else is accepted.
func ValidateID(kind, id string) error {
	if id == "" {
		return fmt.Errorf("%s id is empty", kind)
	}
	if len(id) > MaxIDLength {
		return fmt.Errorf("%s id is %d bytes, longer than %d", kind, len(id), MaxIDLength)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if i == 0 && !alnum {
			return fmt.Errorf("%s id %q must start with a letter or digit", kind, id)
		}
		if !alnum && c != '.' && c != '_' && c != '-' {
			return fmt.Errorf("%s id %q contains %q", kind, id, c)
		}
	}
	return nil
}

// Validate checks the header's fields.
func (h StreamHeader) Validate() error {
	if err := ValidateID("container", h.ContainerID); err != nil {
		return err
	}
	if h.ExecID != "" {
		if err := ValidateID("exec", h.ExecID); err != nil {
			return err
		}
	}
	switch h.Stream {
	case Stdin, Stdout, Stderr:
		return nil
	}
	return fmt.Errorf("unknown stream %q", h.Stream)
}

// Encode returns the header line.
func (h StreamHeader) Encode() ([]byte, error) {
	if err := h.Validate(); err != nil {
		return nil, err
	}
	exec := h.ExecID
	if exec == "" {
		exec = noExec
	}
	line := fmt.Appendf(nil, "%s %d %s %s %s", streamMagic, ProtocolVersion, h.ContainerID, exec, h.Stream)
	if h.Reattach {
		line = append(line, " "+reattachFlag...)
	}
	return append(line, '\n'), nil
}

// ParseStreamHeader parses one header line (without or with its newline).
func ParseStreamHeader(line []byte) (StreamHeader, error) {
	s := strings.TrimSuffix(string(line), "\n")
	if len(s) > maxHeaderLine {
		return StreamHeader{}, fmt.Errorf("stream header is %d bytes, longer than %d", len(s), maxHeaderLine)
	}
	f := strings.Split(s, " ")
	if len(f) < 5 || len(f) > 6 || f[0] != streamMagic || len(f) == 6 && f[5] != reattachFlag {
		return StreamHeader{}, fmt.Errorf("malformed stream header %q", truncate(s))
	}
	if f[1] != fmt.Sprint(ProtocolVersion) {
		return StreamHeader{}, fmt.Errorf("stream protocol version %q, want %d", truncate(f[1]), ProtocolVersion)
	}
	h := StreamHeader{ContainerID: f[2], ExecID: f[3], Stream: Stream(f[4]), Reattach: len(f) == 6}
	if h.ExecID == noExec {
		h.ExecID = ""
	}
	if err := h.Validate(); err != nil {
		return StreamHeader{}, err
	}
	return h, nil
}

// ReadStreamHeader reads the header line from r one byte at a time, so that
// nothing after the newline is consumed from the stream.
func ReadStreamHeader(r io.Reader) (StreamHeader, error) {
	var buf []byte
	var b [1]byte
	for {
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return StreamHeader{}, fmt.Errorf("read stream header: %w", err)
		}
		if b[0] == '\n' {
			return ParseStreamHeader(buf)
		}
		buf = append(buf, b[0])
		if len(buf) > maxHeaderLine {
			return StreamHeader{}, fmt.Errorf("stream header longer than %d bytes", maxHeaderLine)
		}
	}
}

// OpenStream writes the header on a fresh connection to StreamPort and reads
// the agent's answer; on success conn is the stream.
func OpenStream(conn io.ReadWriter, h StreamHeader) error {
	line, err := h.Encode()
	if err != nil {
		return err
	}
	if _, err := conn.Write(line); err != nil {
		return fmt.Errorf("write stream header: %w", err)
	}
	// The reply is short; read byte-wise so stream data stays in conn.
	var reply []byte
	var b [1]byte
	for len(reply) < 512 {
		if _, err := io.ReadFull(conn, b[:]); err != nil {
			return fmt.Errorf("read stream reply: %w", err)
		}
		if b[0] == '\n' {
			break
		}
		reply = append(reply, b[0])
	}
	switch r := string(reply); {
	case r == "OK":
		return nil
	case strings.HasPrefix(r, "ERR "):
		return errors.New(strings.TrimPrefix(r, "ERR "))
	default:
		return fmt.Errorf("unexpected stream reply %q", truncate(r))
	}
}

// WriteStreamReply answers a stream header: "OK" when err is nil.
func WriteStreamReply(w io.Writer, err error) error {
	var line string
	if err == nil {
		line = "OK\n"
	} else {
		line = "ERR " + strings.ReplaceAll(err.Error(), "\n", " ") + "\n"
	}
	_, werr := io.WriteString(w, line)
	return werr
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
