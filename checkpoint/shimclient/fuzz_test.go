package shimclient

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// FuzzParseBootstrap: any bootstrap.json contents give an address without
// NUL or newline, or an error of a known class; never a panic.
func FuzzParseBootstrap(f *testing.F) {
	for _, s := range []string{
		`{"version":3,"address":"unix:///run/containerd/s/ab","protocol":"ttrpc"}`,
		`{"address":"unix:///x","protocol":"grpc"}`,
		`{"address":""}`, `{"version":`, `null`, `[]`, `{"address":"a\nb"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := ParseBootstrap(b)
		if err != nil {
			if !errdefs.IsDataLoss(err) && !errdefs.IsNotImplemented(err) {
				t.Fatalf("error of no known class: %v", err)
			}
			return
		}
		if a == "" || strings.ContainsAny(a, "\x00\n") {
			t.Fatalf("address %q", a)
		}
	})
}
