package api

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// FuzzEnvdParsers feeds untrusted envd request parts to their parsers: the
// sandbox from the host and E2b-Sandbox-Id, the user from Basic
// credentials, the files of an upload body. Whatever comes: no panic, an
// InvalidArgument (or 413) error or a result that keeps the rules (a
// sandbox id without '/', NUL or spaces; absolute UTF-8 paths; files within
// the bound).
func FuzzEnvdParsers(f *testing.F) {
	f.Add("49983-abc.example", "", "Basic cm9vdDo=", "multipart/form-data; boundary=X",
		"--X\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/a/b\"\r\n\r\nhi\r\n--X--\r\n", "")
	f.Add("cube:3000", "sandbox1", "Basic !!", "application/octet-stream", "data", "/p")
	f.Add("3000-x.y", " a/b ", "Bearer k", "multipart/form-data", "", "")
	f.Add("", "", "Basic "+strings.Repeat("A", 100), "multipart/form-data; boundary=\"\"", "--\r\n", "rel")
	f.Fuzz(func(t *testing.T, host, header, auth, ctype, body, qpath string) {
		if id, err := envdTarget(host, header); err == nil {
			if id == "" || strings.ContainsAny(id, "/\x00 ") {
				t.Errorf("envdTarget(%q, %q) = %q", host, header, id)
			}
		} else if !errdefs.IsInvalidArgument(err) {
			t.Errorf("envdTarget: %v is not InvalidArgument", err)
		}
		if _, err := envdUser(auth); err != nil && !errdefs.IsInvalidArgument(err) {
			t.Errorf("envdUser: %v is not InvalidArgument", err)
		}
		const max = 64
		files, err := readUpload(ctype, qpath, bytes.NewReader([]byte(body)), max)
		if err != nil {
			var big fileTooLarge
			if !errdefs.IsInvalidArgument(err) && !errors.As(err, &big) {
				t.Errorf("readUpload: %v is neither InvalidArgument nor too large", err)
			}
			return
		}
		for _, u := range files {
			if len(u.data) > max || (u.path != qpath && checkFilePath("path", u.path) != nil) {
				t.Errorf("readUpload: file %q of %d bytes", u.path, len(u.data))
			}
		}
	})
}
