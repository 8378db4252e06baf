package store

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/containerd/errdefs"
)

// ErrCorrupt classifies metadata that does not validate (errdefs.IsDataLoss
// holds for it too); ErrVersion metadata of another store format version
// (errdefs.IsFailedPrecondition).
var (
	ErrCorrupt = fmt.Errorf("store metadata is malformed: %w", errdefs.ErrDataLoss)
	ErrVersion = fmt.Errorf("unsupported store format version: %w", errdefs.ErrFailedPrecondition)
)

// Limits on what the store accepts, from callers and from its own files.
const (
	// IDLen is the length of a snapshot id: lowercase hex of 12 random bytes.
	IDLen = 24
	// MaxNameLen bounds a name and an operation id.
	MaxNameLen = 128
	// MaxNames bounds the names of one snapshot.
	MaxNames = 32
	// MaxTextLen bounds a sandbox id and a holder's name.
	MaxTextLen = 256
)

// newID returns a fresh snapshot id (96 random bits).
func newID() (string, error) {
	var b [IDLen / 2]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("snapshot id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// isID says whether s has the shape of a snapshot id.
func isID(s string) bool {
	if len(s) != IDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func checkID(field, s string) error {
	if !isID(s) {
		return fmt.Errorf("%s %q: not a snapshot id (%d lowercase hex digits)", field, s, IDLen)
	}
	return nil
}

// nameRule is what checkName accepts, for messages.
const nameRule = "letters, digits, '.', '_' and '-', starting with a letter or digit, at most 128 bytes, and not the shape of a snapshot id (24 lowercase hex digits)"

// checkName accepts a snapshot name or an operation id: it becomes a file
// name under names/, so it must be safe as one, and it must not look like an
// id, so that Get can take either.
func checkName(field, s string) error {
	ok := s != "" && len(s) <= MaxNameLen && !isID(s)
	for i := 0; ok && i < len(s); i++ {
		c := s[i]
		alnum := '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
		ok = alnum || i > 0 && (c == '.' || c == '_' || c == '-')
	}
	if !ok {
		return fmt.Errorf("%s %q: only %s are allowed", field, s, nameRule)
	}
	return nil
}

// checkText accepts a sandbox id or a holder's name: 1 to MaxTextLen bytes
// of valid UTF-8 without control characters.
func checkText(field, s string) error {
	if s == "" {
		return fmt.Errorf("%s is empty", field)
	}
	if len(s) > MaxTextLen {
		return fmt.Errorf("%s is %d bytes, at most %d", field, len(s), MaxTextLen)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s %q is not valid UTF-8", field, s)
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("%s %q has a control character", field, s)
		}
	}
	return nil
}

// The check functions return unclassified errors; the caller classes them:
// invalid for what a caller passed, corrupt for what a file held.

func invalid(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
}

func corrupt(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", err, ErrCorrupt)
}
