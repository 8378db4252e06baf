package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cube-runtime/cube/snapshotter/service"
)

// The test binary doubles as cube-snapshotter when this variable is set, so
// the crash test can SIGKILL a real server process.
const envServe = "CUBE_SNAPSHOTTER_TEST_SERVE"

func TestMain(m *testing.M) {
	if os.Getenv(envServe) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

type server struct {
	cmd  *exec.Cmd
	sock string
	sn   snapshots.Snapshotter
	conn *grpc.ClientConn
}

func startServer(t *testing.T, cfg, root, sock string) *server {
	t.Helper()
	cmd := exec.Command(os.Args[0], "--config", cfg)
	cmd.Env = append(os.Environ(), envServe+"=1")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		t.Logf("server log:\n%s", logs.String())
	})
	// Ready when the status file names this process: a killed predecessor
	// leaves its socket and status file behind.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if st, err := service.ReadStatus(root); err == nil && st.PID == cmd.Process.Pid {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not become ready on %s", sock)
		}
		time.Sleep(10 * time.Millisecond)
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &server{cmd: cmd, sock: sock, conn: conn, sn: proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "cube")}
}

func (s *server) kill(t *testing.T) {
	s.cmd.Process.Signal(syscall.SIGKILL)
	s.cmd.Wait()
	s.conn.Close()
}

func entries(t *testing.T, dir string) []string {
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n []string
	for _, e := range es {
		n = append(n, e.Name())
	}
	return n
}

// TestKillDuringPrepare SIGKILLs a real cube-snapshotter in the middle of a
// Prepare (copying a 160 MiB parent) and restarts it: committed snapshots and
// their data survive, the half-created image is gone, no record was made.
func TestKillDuringPrepare(t *testing.T) {
	for _, tool := range []string{"mkfs.ext4", "debugfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found: install e2fsprogs", tool)
		}
	}
	if testing.Short() {
		t.Skip("-short: writes a 160 MiB image")
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	sock := filepath.Join(dir, "s.sock")
	cfg := filepath.Join(dir, "config.toml")
	// reflink = never: a copy is slow enough to be interrupted on any filesystem.
	os.WriteFile(cfg, []byte("root = \""+root+"\"\naddress = \""+sock+"\"\n[image]\ndefault_size = \"256MiB\"\nreflink = \"never\"\n"), 0o600)
	ctx := namespaces.WithNamespace(context.Background(), "crash")

	s := startServer(t, cfg, root, sock)
	m, err := s.sn.Prepare(ctx, "base-active", "")
	if err != nil {
		t.Fatal(err)
	}
	payload := filepath.Join(dir, "payload")
	os.WriteFile(payload, bytes.Repeat([]byte("cube"), 40<<20), 0o644)
	if out, err := exec.Command("debugfs", "-w", "-R", "write "+payload+" payload", m[0].Source).CombinedOutput(); err != nil {
		t.Fatalf("debugfs write: %v: %s", err, out)
	}
	if err := s.sn.Commit(ctx, "base", "base-active"); err != nil {
		t.Fatal(err)
	}
	baseImg := m[0].Source

	// Start a Prepare and freeze the server (SIGSTOP) as soon as its temporary image exists, then kill it.
	// On a fast, idle machine the copy can finish between seeing the file and the stop; then the finished
	// child is removed and the attempt repeated, so the crash really lands mid-Prepare.
	tmp := filepath.Join(root, "tmp")
	var child string
	for attempt := 0; child == ""; attempt++ {
		if attempt == 5 {
			t.Fatal("could not stop the server mid-Prepare in 5 attempts")
		}
		key := fmt.Sprintf("child-%d", attempt)
		done := make(chan error, 1)
		go func() { _, err := s.sn.Prepare(ctx, key, "base"); done <- err }()
		deadline := time.Now().Add(20 * time.Second)
		finished := false
		for len(entries(t, tmp)) == 0 && !finished {
			select {
			case <-done:
				finished = true
			default:
			}
			if time.Now().After(deadline) {
				t.Fatal("Prepare never started building its image")
			}
			time.Sleep(time.Millisecond)
		}
		if !finished {
			s.cmd.Process.Signal(syscall.SIGSTOP)
			if len(entries(t, tmp)) > 0 {
				child = key
				break
			}
			s.cmd.Process.Signal(syscall.SIGCONT)
			<-done
		}
		if err := s.sn.Remove(ctx, key); err != nil {
			t.Fatalf("remove the uninterrupted %s: %v", key, err)
		}
	}
	s.kill(t) // SIGKILL ends a stopped process too
	if len(entries(t, tmp)) == 0 {
		t.Fatal("the half-built image vanished before the kill")
	}

	s = startServer(t, cfg, root, sock)
	if left := entries(t, tmp); len(left) != 0 {
		t.Fatalf("half-created image survived restart: %v", left)
	}
	if _, err := s.sn.Stat(ctx, child); err == nil {
		t.Fatal("interrupted Prepare left a record")
	}
	info, err := s.sn.Stat(ctx, "base")
	if err != nil || info.Kind != snapshots.KindCommitted {
		t.Fatalf("committed base after crash: %+v %v", info, err)
	}
	out, err := exec.Command("debugfs", "-R", "stat payload", baseImg).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Size: 167772160") {
		t.Fatalf("committed payload after crash: %v\n%s", err, out)
	}
	if imgs := entries(t, filepath.Join(root, "snapshots")); len(imgs) != 1 {
		t.Fatalf("images after restart: %v, want only the base", imgs)
	}
	// And the snapshotter works again.
	if _, err := s.sn.Prepare(ctx, "child", "base"); err != nil {
		t.Fatal(err)
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	if err := s.cmd.Wait(); err != nil {
		t.Fatalf("server exit on SIGTERM: %v", err)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Error("socket left after SIGTERM")
	}
}
