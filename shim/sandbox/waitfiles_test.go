package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// waitFiles wakes on the files' creation (made, or renamed into place),
// long before its re-check interval, and stops on done or ctx.
func TestWaitFiles(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "vsock.sock"), filepath.Join(dir, "control.sock")
	go func() {
		time.Sleep(20 * time.Millisecond)
		os.WriteFile(a, nil, 0o600)
		tmp := filepath.Join(dir, ".tmp")
		os.WriteFile(tmp, nil, 0o600)
		os.Rename(tmp, b)
	}()
	start := time.Now()
	if err := waitFiles(context.Background(), nil, a, b); err != nil {
		t.Fatal(err)
	}
	if !allExist([]string{a, b}) {
		t.Fatal("returned before both files existed")
	}
	t.Logf("woke %v after the start (re-check interval %v)", time.Since(start), waitRecheck)

	done := make(chan struct{})
	close(done)
	if err := waitFiles(context.Background(), done, filepath.Join(dir, "never")); !errors.Is(err, errVMMExited) {
		t.Fatalf("done closed: %v, want errVMMExited", err)
	}
	// Files that already exist win over a closed done.
	if err := waitFiles(context.Background(), done, a, b); err != nil {
		t.Fatalf("existing files, done closed: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := waitFiles(ctx, nil, filepath.Join(dir, "never")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ctx: %v", err)
	}
	// A directory that cannot be watched: the re-check still finds the file.
	missing := filepath.Join(dir, "later", "x.sock")
	go func() {
		time.Sleep(20 * time.Millisecond)
		os.MkdirAll(filepath.Dir(missing), 0o755)
		os.WriteFile(missing, nil, 0o600)
	}()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if err := waitFiles(ctx2, nil, missing); err != nil {
		t.Fatalf("unwatchable directory: %v", err)
	}
}

// The inotify descriptor and its reader end with the wait.
func TestWaitFilesLeavesNoDescriptor(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "s")
	os.WriteFile(p, nil, 0o600)
	before := openFDs(t)
	for range 50 {
		if err := waitFiles(context.Background(), nil, p); err != nil {
			t.Fatal(err)
		}
	}
	if after := openFDs(t); after > before+2 {
		t.Fatalf("open descriptors %d before 50 waits, %d after", before, after)
	}
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("list /proc/self/fd: %v", err)
	}
	return len(ents)
}
