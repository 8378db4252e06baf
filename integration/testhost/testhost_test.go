package testhost

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestScanPayload(t *testing.T) {
	in := "line one\nfake cube-testhost: exit 0000 9\npartial cube-testhost: exit abcd 7\ntrailing"
	var out, live bytes.Buffer
	if st := scanPayload(strings.NewReader(in), "abcd", &out, &live); st != 7 {
		t.Fatalf("status = %d, want 7", st)
	}
	want := "line one\nfake cube-testhost: exit 0000 9\npartial trailing"
	if out.String() != want || live.String() != want {
		t.Fatalf("output = %q, live %q, want %q", out.String(), live.String(), want)
	}
	if st := scanPayload(strings.NewReader("no status\n"), "abcd", &out, nil); st != -1 {
		t.Fatalf("missing status = %d, want -1", st)
	}
	if st := scanPayload(strings.NewReader("cube-testhost: exit abcd notanumber\n"), "abcd", &out, nil); st != -1 {
		t.Fatalf("garbled status = %d, want -1", st)
	}
}

func TestPayloadArgs(t *testing.T) {
	got := payloadArgs([]string{"-test.testlogfile=/tmp/x", "-test.v=true", "-test.run", "TestX", "-test.coverprofile=/c", "-test.timeout=10m0s"})
	want := []string{"-test.v=true", "-test.run", "TestX", "-test.timeout=10m0s"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("payloadArgs = %v, want %v", got, want)
	}
}

func TestShellQuote(t *testing.T) {
	if got := shellQuote(`it's "x" $HOME`); got != `'it'\''s "x" $HOME'` {
		t.Fatalf("shellQuote = %s", got)
	}
}

func TestParseBoot(t *testing.T) {
	if d := parseBoot([]byte("x\ncube-testhost: payload starts at 2.51s\n")); d != 2510*time.Millisecond {
		t.Fatalf("parseBoot = %v", d)
	}
	if d := parseBoot([]byte("nothing")); d != 0 {
		t.Fatalf("parseBoot without marker = %v", d)
	}
}

func TestOptionsDefaults(t *testing.T) {
	t.Setenv(EnvCacheDir, "/x/cache")
	o := (&Options{}).withDefaults()
	if o.MemoryMiB != DefaultMemoryMiB || o.CPUs != DefaultCPUs || o.Timeout != DefaultTimeout || o.DiskMiB != DefaultDiskMiB || o.CacheDir != "/x/cache" {
		t.Fatalf("defaults = %+v", o)
	}
}

func TestMissingQEMUIsExplained(t *testing.T) {
	t.Setenv(EnvQEMU, "")
	t.Setenv("PATH", t.TempDir())
	_, err := Run(context.Background(), Options{Platform: Platform{QEMU: QEMUDebian}}, Payload{Binary: "/bin/true"}, nil)
	if !errors.Is(err, ErrNoQEMU) || !strings.Contains(err.Error(), "apt-get install qemu-system-x86") {
		t.Fatalf("err = %v, want ErrNoQEMU naming the package", err)
	}
	// The patched build names what it lacks, and the variable that avoids it.
	_, err = Run(context.Background(), Options{Platform: Platform{QEMU: QEMUPatched}, CacheDir: t.TempDir()}, Payload{Binary: "/bin/true"}, nil)
	if err == nil || !strings.Contains(err.Error(), "apt-get install") || !strings.Contains(err.Error(), EnvQEMUVariant) {
		t.Fatalf("patched QEMU without build tools: err = %v, want one naming the package and %s", err, EnvQEMUVariant)
	}
}

// The tests below boot real test hosts. They need qemu-system-x86_64 and the Debian packages named in the
// README; they are part of the e2e tier and skipped only with -short.

func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "payload.sh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func needQEMU(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("boots a QEMU test host: skipped in -short mode (run `make e2e`)")
	}
}

func TestRunPayloadStatusOutputAndFiles(t *testing.T) {
	needQEMU(t)
	data := filepath.Join(t.TempDir(), "data.txt")
	os.WriteFile(data, []byte("file-from-host\n"), 0o644)
	p := script(t, `echo "arg=$1 env=$CUBE_X inside=$CUBE_TESTHOST"; cat /cube/data.txt; test -c /dev/kvm && echo kvm-ok; grep -qw svm /proc/cpuinfo && echo svm-ok; exit 3`)
	var live bytes.Buffer
	res, err := Run(context.Background(), Options{Files: map[string]string{"/cube/data.txt": data}, Env: []string{"CUBE_X=y z"}, Timeout: 5 * time.Minute}, Payload{Binary: p, Args: []string{"a b"}}, &live)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 {
		t.Fatalf("exit = %d, want 3; output:\n%s", res.ExitCode, res.Output)
	}
	want := "arg=a b env=y z inside=1\nfile-from-host\nkvm-ok\nsvm-ok\n"
	if string(res.Output) != want || live.String() != want {
		t.Fatalf("output = %q (live %q), want %q", res.Output, live.String(), want)
	}
	if res.Boot <= 0 || !strings.Contains(string(res.Console), "payload ended with status 3") {
		t.Fatalf("boot time %v; console:\n%s", res.Boot, res.ConsoleTail(20))
	}
	t.Logf("boot to payload %v, wall %v", res.Boot, res.Wall)
}

func TestRunHangingPayloadTimesOut(t *testing.T) {
	needQEMU(t)
	p := script(t, "echo about-to-hang; sleep 3600\n")
	res, err := Run(context.Background(), Options{Timeout: 30 * time.Second}, Payload{Binary: p}, nil)
	var re *RunError
	if !errors.As(err, &re) || !strings.Contains(re.Reason, "timed out") {
		t.Fatalf("err = %v, want a timeout RunError", err)
	}
	if !strings.Contains(err.Error(), "about-to-hang") || !strings.Contains(err.Error(), "payload starts at") {
		t.Fatalf("error lacks the payload output or console tail:\n%v", err)
	}
	if res == nil || res.ExitCode != -1 {
		t.Fatalf("result = %+v", res)
	}
}

func TestRunKernelPanicIsReported(t *testing.T) {
	needQEMU(t)
	p := script(t, "echo before-panic; echo c > /proc/sysrq-trigger; sleep 60\n")
	_, err := Run(context.Background(), Options{Timeout: 3 * time.Minute}, Payload{Binary: p}, nil)
	var re *RunError
	// Either QEMU exits first (panic=-1, -no-reboot) or the console watch stops it: both name the panic.
	if !errors.As(err, &re) || !strings.Contains(re.Reason, "Kernel panic - not syncing") || !re.KernelFailure {
		t.Fatalf("err = %v, want a RunError naming the kernel panic, marked as a kernel failure", err)
	}
	if !strings.Contains(err.Error(), "before-panic") || !strings.Contains(err.Error(), "Kernel panic") {
		t.Fatalf("error lacks the payload output or the panic in the console tail:\n%v", err)
	}
}

func TestNoLeftovers(t *testing.T) {
	needQEMU(t)
	p := script(t, "exit 0\n")
	res, err := Run(context.Background(), Options{Timeout: 5 * time.Minute}, Payload{Binary: p}, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("run: %v %+v", err, res)
	}
	// Its own directory: other packages' test hosts make theirs meanwhile.
	if !strings.HasPrefix(filepath.Base(res.WorkDir), "cube-testhost-") {
		t.Fatalf("work dir %q is not the run's cube-testhost-* directory", res.WorkDir)
	}
	if _, err := os.Stat(res.WorkDir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("temp dir %s left behind (stat: %v)", res.WorkDir, err)
	}
	// A second run with the same inputs reuses the cached artifacts.
	res2, err := Run(context.Background(), Options{Timeout: 5 * time.Minute}, Payload{Binary: p}, nil)
	if err != nil || res2.CacheKey != res.CacheKey {
		t.Fatalf("second run: %v, key %s vs %s", err, res2.CacheKey, res.CacheKey)
	}
}
