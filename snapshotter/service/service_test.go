package service

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func testLog(t *testing.T) *logrus.Entry {
	l := logrus.New()
	l.SetOutput(logWriter{t})
	l.SetLevel(logrus.DebugLevel)
	return logrus.NewEntry(l)
}

type logWriter struct{ t *testing.T }

func (w logWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

func needMkfs(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 not found: install e2fsprogs")
	}
	if _, err := exec.LookPath("debugfs"); err != nil {
		t.Skip("debugfs not found: install e2fsprogs")
	}
}

// startService runs a service on a short socket path and returns a client and a stop func.
func startService(t *testing.T, cfg Config) (*Service, snapshots.Snapshotter, func()) {
	t.Helper()
	svc, err := Start(context.Background(), cfg, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx) }()
	conn, err := grpc.NewClient("unix://"+cfg.Address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	client := proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "cube")
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}
	t.Cleanup(stop)
	return svc, client, stop
}

// TestServeOverSocket drives the snapshotter through containerd's own proxy
// client, the same path containerd's proxy_plugins use.
func TestServeOverSocket(t *testing.T) {
	needMkfs(t)
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.Root = filepath.Join(dir, "root")
	cfg.Address = filepath.Join(dir, "s.sock")
	cfg.Image.DefaultSize = "32MiB"
	// A stale socket file from a killed process must not block start.
	if err := os.WriteFile(cfg.Address, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	svc, sn, stop := startService(t, cfg)
	ctx := namespaces.WithNamespace(context.Background(), "t")

	st, err := ReadStatus(cfg.Root)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode != "copy" && st.Mode != "reflink" || st.Address != cfg.Address || st.DefaultSize != 32<<20 {
		t.Fatalf("status %+v", st)
	}
	if st != svc.Status() {
		t.Fatalf("status file %+v differs from service %+v", st, svc.Status())
	}

	m, err := sn.Prepare(ctx, "a", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || m[0].Type != "ext4" || strings.Join(m[0].Options, ",") != "loop,rw,noload" {
		t.Fatalf("mounts over gRPC: %+v", m)
	}
	if err := sn.Commit(ctx, "base", "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.View(ctx, "v", "base"); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Stat(ctx, "missing"); !errdefs.IsNotFound(err) {
		t.Fatalf("not-found over gRPC: %v", err)
	}
	if err := sn.Remove(ctx, "base"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("remove with child over gRPC: %v", err)
	}
	if c, ok := sn.(snapshots.Cleaner); !ok {
		t.Fatal("proxy client lacks Cleanup")
	} else if err := c.Cleanup(ctx); err != nil {
		t.Fatalf("Cleanup over gRPC: %v", err)
	}
	n := 0
	if err := sn.Walk(ctx, func(context.Context, snapshots.Info) error { n++; return nil }); err != nil || n != 2 {
		t.Fatalf("walk: %d %v", n, err)
	}

	// A second instance on the same socket must refuse, not steal it.
	if _, err := Start(context.Background(), cfg, testLog(t)); err == nil {
		t.Fatal("second service started on a socket in use")
	}

	stop()
	if _, err := os.Stat(cfg.Address); !os.IsNotExist(err) {
		t.Errorf("socket left after stop: %v", err)
	}
	if _, err := ReadStatus(cfg.Root); err == nil {
		t.Error("status file left after stop")
	}
	// Restart: committed data survives.
	_, sn, _ = startService(t, cfg)
	if info, err := sn.Stat(ctx, "base"); err != nil || info.Kind != snapshots.KindCommitted {
		t.Fatalf("after restart: %+v %v", info, err)
	}
}

func TestConfig(t *testing.T) {
	var c Config
	c = DefaultConfig()
	if err := ParseConfig([]byte(DefaultTOML), &c); err != nil {
		t.Fatalf("DefaultTOML does not parse: %v", err)
	}
	if c.Root != DefaultRoot || c.Address != DefaultAddress || c.Image.DefaultSize != DefaultSize || c.Image.Reflink != "auto" {
		t.Fatalf("DefaultTOML disagrees with DefaultConfig: %+v", c)
	}
	c = DefaultConfig()
	err := ParseConfig([]byte("root = \"/x\"\n[image]\ndefault_size = \"2G\"\nreflink = \"required\"\next4_features = [\"^has_journal\"]\n"), &c)
	if err != nil {
		t.Fatal(err)
	}
	o, err := c.SnapshotterOptions()
	if err != nil || o.Root != "/x" || o.DefaultSize != 2<<30 || o.Reflink != "required" || o.Ext4.Features[0] != "^has_journal" {
		t.Fatalf("options %+v %v", o, err)
	}
	for _, bad := range []string{
		"rot = \"/x\"\n",                     // unknown key
		"[image]\ndefault_size = \"huge\"\n", // bad size
		"[image]\ndefault_size = \"1K\"\n",   // too small
		"[image]\nreflink = \"sometimes\"\n", // bad policy
		"root = \"\"\n",                      // empty root
		"root = [\n",                         // not TOML
	} {
		c := DefaultConfig()
		if err := ParseConfig([]byte(bad), &c); err == nil {
			t.Errorf("config %q accepted", bad)
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(DefaultTOML))
	f.Add([]byte("[image]\ndefault_size = \"1.5G\"\n"))
	f.Add([]byte("root = 1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c := DefaultConfig()
		if err := ParseConfig(b, &c); err != nil {
			return
		}
		if _, err := c.SnapshotterOptions(); err != nil {
			t.Fatalf("accepted config fails validation: %v", err)
		}
	})
}

var _ = time.Second
