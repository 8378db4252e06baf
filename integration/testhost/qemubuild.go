package testhost

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/cube-runtime/cube/contrib/guestimage"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// QEMU variants of the test host's emulator (Platform.QEMU).
const (
	// QEMUPatched is Debian's QEMU source (qemuSource) with qemuPatches, built once and cached: the TCG
	// emulation of nested AMD-V without the two bugs that crashed the test host's kernel (docs/testhost.md).
	QEMUPatched = "patched"
	// QEMUDebian is the packaged qemu-system-x86_64 from PATH (or $CUBE_QEMU).
	QEMUDebian = "debian"
)

// qemuSource is the pinned upstream source, as Debian ships it (the "+ds" tarball of qemu
// 1:10.0.2+ds-2+deb13u1~bpo12+1, the bookworm-backports binary .ci/install.d/qemu.sh installs).
var qemuSource = struct{ Version, File, URL, SHA256 string }{
	Version: "10.0.2",
	File:    "qemu_10.0.2+ds.orig.tar.xz",
	URL:     "http://deb.debian.org/debian/pool/main/q/qemu/qemu_10.0.2+ds.orig.tar.xz",
	SHA256:  "0901da33844a331bf8b3602b9c1fbd178e60b737c8e3ade678255bd090c9b9f1",
}

// qemuPatches are the fixes, each an exact replacement in a file of the source tree.
//
// The test host's kernel died with a #PF recursion on a %gs-relative load in a KVM_RUN thread, the first
// frame an L1 interrupt taken right after VMRUN, before VMLOAD restored the host's GS base: an interrupt let
// through while GIF=0. Two defects in helper_vmrun can do that or lose interrupts:
//   - Event injection of an external interrupt (EVENTINJ type INTR) sets cs->exception_index to the vector
//     and delivers it at once, but leaves exception_index set. The next exit request (another vCPU's kick)
//     then finds a "pending exception" and delivers the same vector again, now in whatever context the
//     vCPU is in. Reset it once delivered, as every other delivery path does.
//   - interrupt_request is updated without the BQL (helpers run without it under multi-threaded TCG), so a
//     concurrent cpu_interrupt() from another vCPU (an IPI) can be lost, or a cleared bit resurrected.
//     Every other writer holds the BQL; take it here too (upstream made these updates atomic for 10.2).
//
// And one build fix: Debian's +ds tarball has no edk2 firmware blobs; x86_64-softmmu would unpack them.
var qemuPatches = []textPatch{
	{"target/i386/tcg/system/svm_helper.c",
		"#include \"tcg/helper-tcg.h\"\n",
		"#include \"tcg/helper-tcg.h\"\n#include \"qemu/main-loop.h\"\n"},
	{"target/i386/tcg/system/svm_helper.c",
		"    if (ctl_has_irq(env)) {\n        cs->interrupt_request |= CPU_INTERRUPT_VIRQ;\n    }\n",
		"    if (ctl_has_irq(env)) {\n" +
			"        /* cube: other vCPUs update interrupt_request under the BQL; do not race them. */\n" +
			"        BQL_LOCK_GUARD();\n" +
			"        cs->interrupt_request |= CPU_INTERRUPT_VIRQ;\n    }\n"},
	{"target/i386/tcg/system/svm_helper.c",
		"            do_interrupt_x86_hardirq(env, vector, 1);\n            break;\n",
		"            do_interrupt_x86_hardirq(env, vector, 1);\n" +
			"            /* cube: delivered; do not leave it pending to be delivered again. */\n" +
			"            cs->exception_index = -1;\n            break;\n"},
	{"meson.build",
		"    unpack_edk2_blobs = bzip2.found()\n",
		"    unpack_edk2_blobs = false\n"},
}

// qemuConfigure is the configure line: one target, TCG, nothing optional but what the test host uses
// (-M pc, virtio-blk, serial files). Firmware (SeaBIOS, option ROMs) comes from Debian's qemu-system-data
// and seabios packages, installed with qemu-system-x86.
var qemuConfigure = []string{
	"--target-list=x86_64-softmmu", "--without-default-features", "--enable-tcg", "--enable-fdt=system",
	"--disable-docs", "--disable-werror", "--disable-debug-info", "--disable-install-blobs", "--disable-tools",
	"--firmwarepath=/usr/share/qemu:/usr/share/seabios:/usr/lib/ipxe/qemu",
}

// qemuBuildFormat is part of the cache key: bump it when the build procedure changes in ways the other
// inputs do not show.
const qemuBuildFormat = "1"

// qemuTools are the commands a build needs, with their Debian packages (.ci/install.d/qemu.sh installs them).
var qemuTools = [][2]string{
	{"tar", "tar"}, {"xz", "xz-utils"}, {"gcc", "gcc"}, {"ninja", "ninja-build"}, {"meson", "meson (bookworm-backports: QEMU 10 needs ≥ 1.5)"},
	{"pkg-config", "pkg-config"}, {"flex", "flex"}, {"bison", "bison"},
}

// minMeson is the oldest meson QEMU 10.0 accepts.
var minMeson = [2]int{1, 5}

// buildQEMU returns the path of the patched qemu-system-x86_64, cached under cacheDir/qemu/<key>/ where key
// hashes every input: the source tarball, the patches, the configure line and the compiler. A build takes
// about six minutes on two cores; concurrent callers wait for the one that builds.
func buildQEMU(ctx context.Context, cacheDir string, logf func(string, ...any)) (string, error) {
	if err := needTools(qemuTools); err != nil {
		return "", fmt.Errorf("building the patched QEMU (%s=%s): %w", EnvQEMUVariant, QEMUPatched, err)
	}
	python, err := systemPython()
	if err != nil {
		return "", err
	}
	if err := checkMeson(ctx); err != nil {
		return "", err
	}
	ccVersion, err := exec.CommandContext(ctx, "gcc", "--version").Output()
	if err != nil {
		return "", fmt.Errorf("gcc --version: %w", err)
	}
	key := qemuKey(string(ccVersion))
	dir := filepath.Join(cacheDir, "qemu", key)
	bin := filepath.Join(dir, "qemu-system-x86_64")
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
	// Ordering: take the build lock, then look again: the caller we waited for may have published it.
	lock, err := os.OpenFile(filepath.Join(filepath.Dir(dir), key+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		logf("patched QEMU %s: another process is building it; waiting", key)
		if err := flockCtx(ctx, lock); err != nil {
			return "", err
		}
	}
	defer unix.Flock(int(lock.Fd()), unix.LOCK_UN)
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err == nil {
		return bin, nil
	}

	tarball, err := fetchQEMUSource(ctx, filepath.Join(cacheDir, "src"), logf)
	if err != nil {
		return "", err
	}
	start := time.Now()
	logf("patched QEMU %s: building QEMU %s with its nested-SVM fixes (about 6 minutes on 2 cores; cached afterwards)", key, qemuSource.Version)
	work, err := os.MkdirTemp(filepath.Dir(dir), key+".work-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	res, err := os.MkdirTemp(filepath.Dir(dir), key+".tmp-")
	if err != nil {
		return "", err
	}
	published := false
	defer func() {
		if !published {
			os.RemoveAll(res)
		}
	}()
	if err := os.Chmod(res, 0o755); err != nil {
		return "", err
	}
	if err := buildQEMUIn(ctx, work, res, tarball, python, runtime.NumCPU()); err != nil {
		return "", fmt.Errorf("build the patched QEMU (%s=%s; %s=%s uses Debian's instead): %w", EnvQEMUVariant, QEMUPatched, EnvQEMUVariant, QEMUDebian, err)
	}
	out, err := exec.CommandContext(ctx, filepath.Join(res, "qemu-system-x86_64"), "--version").Output()
	if err != nil || !strings.Contains(string(out), "version "+qemuSource.Version) {
		return "", fmt.Errorf("the built qemu-system-x86_64 --version = %q (%v), want version %s", strings.TrimSpace(string(out)), err, qemuSource.Version)
	}
	if err := os.WriteFile(filepath.Join(res, ".complete"), nil, 0o644); err != nil {
		return "", err
	}
	if err := guestimage.PublishDir(res, dir); err != nil {
		return "", err
	}
	published = true
	logf("patched QEMU %s: built in %s: %s", key, time.Since(start).Round(time.Second), bin)
	return bin, nil
}

// qemuKey is the cache key of a build with compiler version cc.
func qemuKey(cc string) string {
	h := sha256.New()
	fmt.Fprintf(h, "format %s\nsource %s %s\npatches %q\nconfigure %q\ncc %s\n", qemuBuildFormat, qemuSource.File, qemuSource.SHA256, qemuPatches, qemuConfigure, cc)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// buildQEMUIn unpacks, patches, configures and builds in work; res receives the binary, the build log and
// the patched files (to show what was built).
func buildQEMUIn(ctx context.Context, work, res, tarball, python string, jobs int) error {
	if out, err := exec.CommandContext(ctx, "tar", "-xJf", tarball, "-C", work).CombinedOutput(); err != nil {
		return fmt.Errorf("unpack %s: %w: %s", tarball, err, out)
	}
	src := filepath.Join(work, "qemu-"+qemuSource.Version)
	if err := patchFiles(src, "qemu-"+qemuSource.Version, qemuPatches); err != nil {
		return err
	}
	build := filepath.Join(work, "build")
	if err := os.MkdirAll(build, 0o755); err != nil {
		return err
	}
	logPath := filepath.Join(res, "build.log")
	log, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer log.Close()
	steps := [][]string{
		append([]string{filepath.Join(src, "configure"), "--python=" + python}, qemuConfigure...),
		{"ninja", "-j" + strconv.Itoa(jobs), "qemu-system-x86_64"},
	}
	for _, step := range steps {
		fmt.Fprintf(log, "+ %s\n", strings.Join(step, " "))
		cmd := exec.CommandContext(ctx, step[0], step[1:]...)
		cmd.Dir = build
		cmd.Env = append(os.Environ(), "LC_ALL=C")
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Run(); err != nil {
			tail, _ := os.ReadFile(logPath)
			return fmt.Errorf("%s: %w (log %s):\n%s", filepath.Base(step[0]), err, logPath, TailLines(tail, 30))
		}
	}
	if err := copyFile(filepath.Join(build, "qemu-system-x86_64"), filepath.Join(res, "qemu-system-x86_64")); err != nil {
		return err
	}
	for _, f := range uniqueFiles(qemuPatches) {
		if err := copyFile(filepath.Join(src, f), filepath.Join(res, filepath.Base(f))); err != nil {
			return err
		}
	}
	return nil
}

// fetchQEMUSource returns the source tarball in dir, downloading it when absent; its SHA-256 is checked.
func fetchQEMUSource(ctx context.Context, dir string, logf func(string, ...any)) (string, error) {
	path := filepath.Join(dir, qemuSource.File)
	howto := fmt.Sprintf("download %s (SHA-256 %s) into %s on a machine that reaches Debian's archive, or set %s=%s", qemuSource.URL, qemuSource.SHA256, dir, EnvQEMUVariant, QEMUDebian)
	if sum, err := guestimage.FileSHA256(path); err == nil {
		if sum != qemuSource.SHA256 {
			return "", fmt.Errorf("%s has SHA-256 %s, want %s: remove it and %s", path, sum, qemuSource.SHA256, howto)
		}
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	logf("patched QEMU: downloading %s", qemuSource.URL)
	tmp, err := os.CreateTemp(dir, qemuSource.File+".download-")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, qemuSource.URL, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("download the QEMU source: %w; %s", err, howto)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("download the QEMU source: %s: %s; %s", qemuSource.URL, resp.Status, howto)
	}
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(tmp, h), resp.Body); err != nil {
		return "", fmt.Errorf("download the QEMU source: %w; %s", err, howto)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != qemuSource.SHA256 {
		return "", fmt.Errorf("downloaded %s has SHA-256 %s, want %s: the archive changed or the download was altered; %s", qemuSource.URL, sum, qemuSource.SHA256, howto)
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", err
	}
	return path, nil
}

// systemPython is Debian's python3: configure's venv needs the meson and pycotap Debian installed for it,
// which another python3 earlier in PATH (pyenv) would not see.
func systemPython() (string, error) {
	for _, p := range []string{"/usr/bin/python3"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("building the patched QEMU needs Debian's /usr/bin/python3 (apt-get install python3 python3-venv)")
}

var mesonVersionRE = regexp.MustCompile(`^(\d+)\.(\d+)`)

// checkMeson refuses a meson older than QEMU accepts, naming where a newer one is.
func checkMeson(ctx context.Context) error {
	out, err := exec.CommandContext(ctx, "meson", "--version").Output()
	if err != nil {
		return fmt.Errorf("meson --version: %w", err)
	}
	v := strings.TrimSpace(string(out))
	m := mesonVersionRE.FindStringSubmatch(v)
	if m == nil {
		return fmt.Errorf("meson --version = %q: not a version", v)
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	if major < minMeson[0] || (major == minMeson[0] && minor < minMeson[1]) {
		return fmt.Errorf("meson %s is too old to build QEMU %s (needs ≥ %d.%d): apt-get install -t bookworm-backports meson", v, qemuSource.Version, minMeson[0], minMeson[1])
	}
	return nil
}

// flockCtx waits for an exclusive lock on f until ctx ends.
func flockCtx(ctx context.Context, f *os.File) error {
	for {
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// QEMUBinary returns the qemu-system-x86_64 that Run would start for o, building the patched one if it is
// not cached yet. Nothing boots.
func QEMUBinary(ctx context.Context, o Options) (string, error) {
	opts := o.withDefaults()
	if err := opts.Platform.validate(); err != nil {
		return "", err
	}
	return findQEMU(ctx, opts, logrus.Infof)
}
