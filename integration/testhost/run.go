package testhost

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
)

// ErrNoQEMU is returned when qemu-system-x86_64 is missing.
var ErrNoQEMU = errors.New("qemu-system-x86_64 not found: install Debian's qemu-system-x86 (`apt-get install qemu-system-x86`) or set " + EnvQEMU)

// RunError is a failed run of the test host itself (not a payload that exited non-zero): the payload's status
// never arrived. It carries what was seen so the cause is visible.
type RunError struct {
	Reason string
	Result *Result
	// KernelFailure: the test host's own kernel panicked or locked up. Our code runs in its user space and
	// nested guests, so this is the emulated machine failing, not a test result.
	KernelFailure bool
}

func (e *RunError) Error() string {
	if r := KernelReport(e.Result.Console, 80); e.KernelFailure && r != "" {
		return fmt.Sprintf("test host: %s\n--- payload output (tail) ---\n%s\n--- test host kernel report (first 80 lines) ---\n%s\n--- test host console (tail) ---\n%s",
			e.Reason, TailLines(e.Result.Output, 30), r, e.Result.ConsoleTail(40))
	}
	return fmt.Sprintf("test host: %s\n--- payload output (tail) ---\n%s\n--- test host console (tail) ---\n%s",
		e.Reason, TailLines(e.Result.Output, 30), e.Result.ConsoleTail(40))
}

// findQEMU is $CUBE_QEMU when set, else the Platform's variant: the patched build (made on first use) or
// the packaged binary from PATH.
func findQEMU(ctx context.Context, opts Options, logf func(string, ...any)) (string, error) {
	if q := os.Getenv(EnvQEMU); q != "" {
		return q, nil
	}
	if opts.Platform.QEMU == QEMUPatched {
		return buildQEMU(ctx, opts.CacheDir, logf)
	}
	q, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return "", ErrNoQEMU
	}
	return q, nil
}

// Run boots a test host, runs the payload in it and returns its result. Output, when not nil, receives the
// payload's output as it arrives. A payload that exits non-zero is not an error (see Result.ExitCode); a
// payload that never reports (timeout, kernel panic, QEMU failure) is a *RunError. Nothing is left behind:
// QEMU is killed and the run's files removed on every path.
func Run(ctx context.Context, o Options, p Payload, output io.Writer) (*Result, error) {
	opts := o.withDefaults()
	if _, err := smpFromEnv(); err != nil {
		return nil, err
	}
	if err := opts.Platform.validate(); err != nil {
		return nil, err
	}
	if err := validateForwards(opts.Forwards); err != nil {
		return nil, err
	}
	logf := logrus.Infof
	qemu, err := findQEMU(ctx, opts, logf)
	if err != nil {
		return nil, err
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return nil, fmt.Errorf("mkfs.ext4 not found: install Debian's e2fsprogs (`apt-get install e2fsprogs`)")
	}
	warnOldQEMU(qemu)
	art, err := buildArtifacts(ctx, opts.CacheDir, &opts, logf)
	if err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "cube-testhost-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	nonceBytes := make([]byte, 8)
	if _, err := rand.Read(nonceBytes); err != nil {
		return nil, err
	}
	nonce := hex.EncodeToString(nonceBytes)
	disk := filepath.Join(work, "root.img")
	if err := buildRootDisk(ctx, art, &opts, p, filepath.Join(work, "root"), disk); err != nil {
		return nil, err
	}

	// One core of the machine per test-host vCPU: test hosts that would share cores slow each other, and
	// nested guests under a loaded TCG were the ones seen to stall. The wait does not count against the
	// run's timeout.
	unlock, err := lockMachine(ctx, opts.CPUs, logf)
	if err != nil {
		return nil, err
	}
	defer unlock()

	console := filepath.Join(work, "console.log")
	args := []string{
		"-name", "cube-testhost",
		"-accel", opts.Platform.Accel, "-M", "pc", "-cpu", opts.Platform.CPU,
		"-smp", strconv.Itoa(opts.CPUs), "-m", strconv.Itoa(opts.MemoryMiB),
		"-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none", "-no-reboot",
		"-kernel", art.Vmlinuz, "-initrd", art.Initramfs,
		"-append", strings.TrimSpace("console=ttyS0 loglevel=5 panic=-1 "+opts.Platform.Append) + " cube.nonce=" + nonce,
		"-drive", "file=" + disk + ",if=virtio,format=raw,cache=unsafe",
		"-serial", "file:" + console,
		"-serial", "stdio",
	}
	args = append(args, forwardArgs(opts.Forwards)...)
	rctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	cmd := exec.Command(qemu, args...)
	// The second serial port's input (QEMU's stdin) gets a byte a second: see kickSerial.
	kick, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	var qerr bytes.Buffer
	cmd.Stderr = &qerr
	// Own process group, and killed with us if we die, so no QEMU outlives its caller.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	res := &Result{ExitCode: -1, CacheKey: art.Key, WorkDir: work}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", qemu, err)
	}
	payloadStarted := make(chan struct{})
	watchDone := make(chan struct{})
	defer close(watchDone)
	go kickSerial(kick, payloadStarted, watchDone)
	logrus.Debugf("test host: %s %s", qemu, strings.Join(args, " "))
	logrus.Infof("test host: %d vCPUs, %d MiB, %s", opts.CPUs, opts.MemoryMiB, opts.Platform)
	stopKill := context.AfterFunc(rctx, func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	defer stopKill()
	// A test host whose kernel locked up or panicked will not recover: end the run at once instead of at the
	// timeout, and say why.
	var hung atomic.Value
	go watchConsole(console, watchDone, payloadStarted, func(line string) {
		hung.Store(line)
		logrus.Errorf("test host: kernel reported %q; stopping it", line)
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	})

	var out bytes.Buffer
	status := -1
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		status = scanPayload(stdout, nonce, &out, output)
	}()
	wg.Wait()
	werr := cmd.Wait()
	res.Wall = time.Since(start)
	res.Output = out.Bytes()
	res.Console, _ = os.ReadFile(console)
	res.Boot = parseBoot(res.Console)

	switch {
	case hung.Load() != nil && status < 0:
		return res, &RunError{Reason: fmt.Sprintf("the test host's kernel failed (%s); run stopped after %s",
			hung.Load(), res.Wall.Round(time.Second)), Result: res, KernelFailure: true}
	case rctx.Err() != nil && status < 0:
		reason := fmt.Sprintf("timed out after %s", opts.Timeout)
		if ctx.Err() != nil {
			reason = "cancelled: " + ctx.Err().Error()
		}
		return res, &RunError{Reason: reason, Result: res}
	case status < 0:
		reason := "the payload's exit status never arrived (kernel panic, init failure or QEMU error)"
		// A panic's header line is followed by a long trace; name it here so the tail need not reach it.
		panicked := false
		if i := bytes.Index(res.Console, []byte("Kernel panic - not syncing")); i >= 0 {
			line, _, _ := bytes.Cut(res.Console[i:], []byte("\n"))
			reason += "; console: " + strings.TrimSpace(string(line))
			panicked = true
		}
		if werr != nil {
			reason += fmt.Sprintf("; QEMU: %v: %s", werr, strings.TrimSpace(filterQEMUWarnings(qerr.String())))
		}
		return res, &RunError{Reason: reason, Result: res, KernelFailure: panicked}
	}
	res.ExitCode = status
	return res, nil
}

// scanPayload copies payload lines to out (and live to w) until the status line tagged with nonce, and
// returns the status, or -1 if the stream ended without one.
func scanPayload(r io.Reader, nonce string, out *bytes.Buffer, w io.Writer) int {
	status := -1
	tag := "cube-testhost: exit " + nonce + " "
	br := bufio.NewReaderSize(r, 64*1024)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			if i := strings.Index(line, tag); i >= 0 && status < 0 {
				if n, perr := strconv.Atoi(strings.TrimSpace(line[i+len(tag):])); perr == nil {
					status = n
				}
				line = line[:i]
			}
			out.WriteString(line)
			if w != nil {
				io.WriteString(w, line)
			}
		}
		if err != nil {
			return status
		}
	}
}

var bootRE = regexp.MustCompile(`cube-testhost: payload starts at ([0-9.]+)s`)

func parseBoot(console []byte) time.Duration {
	m := bootRE.FindSubmatch(console)
	if m == nil {
		return 0
	}
	f, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		return 0
	}
	return time.Duration(f * float64(time.Second))
}

// filterQEMUWarnings drops TCG's harmless "host doesn't support requested feature" lines.
func filterQEMUWarnings(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.Contains(l, "doesn't support requested feature") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// TailLines returns the last n lines of b (a test's output, a log).
func TailLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// buildRootDisk assembles the per-run root tree (the cached base, the payload and its files) and makes an ext4
// image of it with room to spare. mkfs.ext4 -d needs no root privileges and no loop device.
func buildRootDisk(ctx context.Context, art *artifacts, o *Options, p Payload, stage, disk string) error {
	if err := linkTree(art.BaseTree, stage); err != nil {
		return fmt.Errorf("stage root: %w", err)
	}
	if p.Binary == "" {
		return fmt.Errorf("payload: no binary given")
	}
	bin, err := filepath.Abs(p.Binary)
	if err != nil {
		return err
	}
	inside := "/cube/payload/bin/" + filepath.Base(bin)
	if err := installWithLibs(stage, bin, inside); err != nil {
		return fmt.Errorf("payload %s: %w", p.Binary, err)
	}
	for dst, src := range o.Files {
		if !filepath.IsAbs(dst) {
			return fmt.Errorf("Options.Files: path inside the test host %q must be absolute", dst)
		}
		if err := copyTree(src, filepath.Join(stage, dst)); err != nil {
			return fmt.Errorf("Options.Files %s: %w", dst, err)
		}
		// A dynamically linked program brings its libraries, as the payload and tools do.
		if st, err := os.Stat(src); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			if err := installLibs(stage, src); err != nil {
				return fmt.Errorf("Options.Files %s: %w", dst, err)
			}
		}
	}
	params, err := moduleParamsFile(o.Platform.ModuleParams, art.Modules)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(stage, "cube/modparams"), params, 0o644); err != nil {
		return err
	}
	var script strings.Builder
	script.WriteString("export " + EnvInside + "=1\n")
	for _, e := range o.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("Options.Env: %q is not KEY=value", e)
		}
		script.WriteString("export " + shellQuote(e) + "\n")
	}
	script.WriteString(forwardScript(o.Forwards))
	script.WriteString("exec " + shellQuote(inside))
	for _, a := range p.Args {
		script.WriteString(" " + shellQuote(a))
	}
	script.WriteString("\n")
	if err := os.WriteFile(filepath.Join(stage, "cube/payload.sh"), []byte(script.String()), 0o755); err != nil {
		return err
	}

	used, err := treeSize(stage)
	if err != nil {
		return err
	}
	sizeMiB := used/(1<<20)*5/4 + 64 + int64(o.DiskMiB)
	cmd := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-L", "cube-testhost", "-d", stage, disk, fmt.Sprintf("%dM", sizeMiB))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4 -d %s: %w: %s", stage, err, out)
	}
	// The staged tree is no longer needed; free it now rather than at the end of a long run.
	return os.RemoveAll(stage)
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// linkTree recreates src at dst with hard links for files (falling back to copies across filesystems); the
// staged files are only read, so sharing them with the cache is safe.
func linkTree(src, dst string) error { return walkTree(src, dst, true) }

// copyTree copies a file or a directory tree (symlinks kept as links), replacing what is at dst: a hard
// link there into the cache must be replaced, never written through.
func copyTree(src, dst string) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		os.Remove(dst)
		return copyFile(src, dst)
	}
	return walkTree(src, dst, false)
}

func walkTree(src, dst string, link bool) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		os.Remove(target)
		if d.Type()&fs.ModeSymlink != 0 {
			l, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(l, target)
		}
		if link && os.Link(path, target) == nil {
			return nil
		}
		return copyFile(path, target)
	})
}

func treeSize(root string) (int64, error) {
	var n int64
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			n += info.Size() + 4096
		} else {
			n += 4096
		}
		return nil
	})
	return n, err
}

// kickSerial writes a byte a second into the test host's second serial port, from when stage 2 says the
// payload starts until QEMU goes away (the write fails). Each byte is a UART interrupt in the test host; stage
// 2 has put that port in raw mode without echo by then, so the bytes go nowhere (sent earlier, they waited in
// the UART and were echoed into the payload's output when the port was first opened).
//
// Why: a 1-vCPU test host was seen idle for good, its kernel's own 60-second watchdog line never printed — its
// timer interrupt lost, most likely a CPU_INTERRUPT_HARD request dropped by QEMU's unlocked update in
// helper_vmrun racing the main loop's APIC timer (docs/testhost.md). With two vCPUs an IPI from the other one
// raised it again; with one, nothing did. Any new interrupt makes QEMU's APIC raise the request again for
// everything pending, the lost timer vector included.
func kickSerial(w io.WriteCloser, start, done <-chan struct{}) {
	defer w.Close()
	select {
	case <-start:
	case <-done:
		return
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for range t.C {
		if _, err := w.Write([]byte{'.'}); err != nil {
			return
		}
	}
}
