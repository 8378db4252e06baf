package testimages

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Server is an in-memory registry on 127.0.0.1 holding the images.
type Server struct {
	Addr string // host:port
	srv  *http.Server
}

// Serve starts a registry on addr (e.g. "127.0.0.1:0") and pushes imgs into it, each under RepoPath of
// each of its references. logw gets one line per request when not nil.
func Serve(addr string, imgs []Image, logw io.Writer) (*Server, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	opts := []registry.Option{registry.Logger(log.New(io.Discard, "", 0))}
	if logw != nil {
		opts = []registry.Option{registry.Logger(log.New(logw, "registry: ", log.LstdFlags))}
	}
	s := &Server{Addr: l.Addr().String(), srv: &http.Server{Handler: registry.New(opts...)}}
	go s.srv.Serve(l)
	for _, im := range imgs {
		for _, ref := range im.Refs {
			p, err := RepoPath(ref)
			if err != nil {
				s.Close()
				return nil, err
			}
			r, err := name.ParseReference(s.Addr+"/"+p, name.Insecure)
			if err != nil {
				s.Close()
				return nil, fmt.Errorf("%s: %w", ref, err)
			}
			if err := remote.Write(r, im.Img); err != nil {
				s.Close()
				return nil, fmt.Errorf("push %s as %s: %w", ref, r, err)
			}
		}
	}
	return s, nil
}

func (s *Server) Close() error { return s.srv.Close() }

// HostsTOML is containerd's hosts.toml for one registry name: pull and resolve from the plain-HTTP mirror
// at addr (host:port) and nowhere else (server is the mirror too: no fallback to the internet).
func HostsTOML(addr string) string {
	return fmt.Sprintf(`# Written by integration/critest/testimages: critest's images come from a registry in the test host.
server = "http://%[1]s"

[host."http://%[1]s"]
  capabilities = ["pull", "resolve"]
`, addr)
}

// WriteHostsDir writes dir/<registry>/hosts.toml for every name of Registries, pointing at addr: the
// directory is containerd's `config_path` of plugins."io.containerd.cri.v1.images".registry.
func WriteHostsDir(dir, addr string) error {
	if strings.ContainsAny(addr, "\"\n") {
		return fmt.Errorf("registry address %q", addr)
	}
	for _, r := range Registries {
		d := filepath.Join(dir, r)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(d, "hosts.toml"), []byte(HostsTOML(addr)), 0o644); err != nil {
			return err
		}
	}
	return nil
}
