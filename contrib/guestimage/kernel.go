// Package guestimage builds the boot artifacts Cube's Linux guests and the test host share: it fetches and
// unpacks the pinned Debian kernel package, resolves kernel modules with their dependencies, finds the shared
// libraries of host programs, and writes initramfs archives.
package guestimage

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// The one place the guest kernel is pinned. The test host, the guest image and the VMM's default kernel all
// use this package and version.
const (
	KernelPackage = "linux-image-6.1.0-57-cloud-amd64"
	KernelVersion = "6.1.192-3"
	// KernelMetaPackage is used only when the pinned version has left the Debian mirror: the fallback is
	// logged loudly and the resolved version becomes part of every cache key.
	KernelMetaPackage = "linux-image-cloud-amd64"
)

// EnvCacheDir overrides where kernel packages and built images are cached.
const EnvCacheDir = "CUBE_CACHE_DIR"

// DefaultCacheDir is $CUBE_CACHE_DIR, else the user cache directory + /cube.
func DefaultCacheDir() string {
	if d := os.Getenv(EnvCacheDir); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "cube")
	}
	return filepath.Join(os.TempDir(), "cube-cache")
}

// Kernel is an unpacked Debian kernel package.
type Kernel struct {
	Release string // uname -r, e.g. 6.1.0-57-cloud-amd64
	Deb     string // the .deb it was unpacked from
	DebHash string // sha256 of Deb, hex
	Root    string // directory the package was unpacked into
	Vmlinuz string // bzImage

	deps    map[string][]string // module name -> dependency module names
	paths   map[string]string   // module name -> path relative to the modules dir
	builtin map[string]bool
}

// ModulesDir is /lib/modules/<release> inside the unpacked package.
func (k *Kernel) ModulesDir() string {
	return filepath.Join(k.Root, "lib", "modules", k.Release)
}

// FetchKernel returns the pinned kernel package unpacked under cacheDir, downloading it with
// `apt-get download` on first use. CUBE_KERNEL_DEB names a local .deb to use instead (offline machines).
func FetchKernel(ctx context.Context, cacheDir string) (*Kernel, error) {
	deb := os.Getenv("CUBE_KERNEL_DEB")
	if deb == "" {
		var err error
		if deb, err = downloadKernelDeb(ctx, filepath.Join(cacheDir, "debs")); err != nil {
			return nil, err
		}
	}
	sum, err := fileSHA256(deb)
	if err != nil {
		return nil, fmt.Errorf("hash kernel package: %w", err)
	}
	root := filepath.Join(cacheDir, "kernel", sum[:16])
	if _, err := os.Stat(filepath.Join(root, ".complete")); err != nil {
		if err := unpackDeb(ctx, deb, root); err != nil {
			return nil, err
		}
	}
	return openKernel(root, deb, sum)
}

func downloadKernelDeb(ctx context.Context, dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	pinned := filepath.Join(dir, fmt.Sprintf("%s_%s_amd64.deb", KernelPackage, KernelVersion))
	if _, err := os.Stat(pinned); err == nil {
		return pinned, nil
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return "", fmt.Errorf("kernel package %s not cached in %s and apt-get is missing: set CUBE_KERNEL_DEB to a downloaded %s .deb", KernelPackage, dir, KernelPackage)
	}
	tmp, err := os.MkdirTemp(dir, "download-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	out, err := aptDownload(ctx, tmp, KernelPackage+"="+KernelVersion)
	if err != nil {
		logrus.Warnf("pinned kernel %s=%s is not downloadable (%v: %s); falling back to the current %s — update the pin in contrib/guestimage/kernel.go",
			KernelPackage, KernelVersion, err, strings.TrimSpace(out), KernelMetaPackage)
		dep, derr := metaDependency(ctx)
		if derr != nil {
			return "", fmt.Errorf("download kernel package %s=%s: %v: %s (and resolving %s failed: %w)", KernelPackage, KernelVersion, err, out, KernelMetaPackage, derr)
		}
		if out, err = aptDownload(ctx, tmp, dep); err != nil {
			return "", fmt.Errorf("download kernel package %s: %w: %s (is Debian's apt reachable? run `apt-get update`)", dep, err, out)
		}
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return "", fmt.Errorf("download kernel package: expected one .deb in %s, found %d", tmp, len(debs))
	}
	dst := filepath.Join(dir, filepath.Base(debs[0]))
	if err := os.Rename(debs[0], dst); err != nil {
		return "", err
	}
	return dst, nil
}

func aptDownload(ctx context.Context, dir, spec string) (string, error) {
	cmd := exec.CommandContext(ctx, "apt-get", "download", "-q", spec)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// metaDependency returns the versioned kernel package the meta package currently depends on.
func metaDependency(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "apt-cache", "depends", KernelMetaPackage).Output()
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) == 2 && f[0] == "Depends:" && strings.HasPrefix(f[1], "linux-image-") {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("no linux-image dependency in `apt-cache depends %s`", KernelMetaPackage)
}

func unpackDeb(ctx context.Context, deb, root string) error {
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		return fmt.Errorf("unpack %s: dpkg-deb not found (install dpkg)", deb)
	}
	// A unique temporary name: several test runs may fill one cache at once.
	if err := os.MkdirAll(filepath.Dir(root), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(root), filepath.Base(root)+".tmp-")
	if err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", deb, tmp).CombinedOutput(); err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("unpack %s: %w: %s", deb, err, out)
	}
	if err := os.WriteFile(filepath.Join(tmp, ".complete"), nil, 0o644); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	return PublishDir(tmp, root)
}

// PublishDir renames the complete tree tmp to dst, the last step of filling a
// cache entry, so a half-built tree is never taken for a complete one. If
// another process published dst first (it has a .complete marker), tmp is
// dropped and theirs is kept: it may be in use. An incomplete dst (left by
// an older layout) is replaced.
func PublishDir(tmp, dst string) error {
	for range 2 {
		err := os.Rename(tmp, dst)
		if err == nil {
			return nil
		}
		if _, serr := os.Stat(filepath.Join(dst, ".complete")); serr == nil {
			os.RemoveAll(tmp)
			return nil
		}
		if !errors.Is(err, unix.EEXIST) && !errors.Is(err, unix.ENOTEMPTY) {
			os.RemoveAll(tmp)
			return fmt.Errorf("publish %s: %w", dst, err)
		}
		os.RemoveAll(dst)
	}
	os.RemoveAll(tmp)
	return fmt.Errorf("publish %s: another process keeps replacing it", dst)
}

func openKernel(root, deb, sum string) (*Kernel, error) {
	vmlinuz, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if len(vmlinuz) != 1 {
		return nil, fmt.Errorf("kernel package %s: expected one boot/vmlinuz-*, found %d", deb, len(vmlinuz))
	}
	k := &Kernel{
		Release: strings.TrimPrefix(filepath.Base(vmlinuz[0]), "vmlinuz-"),
		Deb:     deb, DebHash: sum, Root: root, Vmlinuz: vmlinuz[0],
	}
	if err := k.loadModuleIndex(); err != nil {
		return nil, fmt.Errorf("kernel package %s: %w", deb, err)
	}
	return k, nil
}

// ModuleName normalizes a module's file or module name ("kvm-amd.ko" -> "kvm_amd"), as the kernel does.
func ModuleName(s string) string {
	return strings.ReplaceAll(strings.TrimSuffix(filepath.Base(s), ".ko"), "-", "_")
}

// loadModuleIndex indexes every .ko of the package by module name with its dependencies, read from each
// module's .modinfo "depends=" field (a package carries no modules.dep: depmod makes it at install time).
func (k *Kernel) loadModuleIndex() error {
	k.deps, k.paths, k.builtin = map[string][]string{}, map[string]string{}, map[string]bool{}
	dir := k.ModulesDir()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !strings.HasSuffix(path, ".ko") {
			return nil
		}
		rel, _ := filepath.Rel(dir, path)
		info, err := readModinfo(path)
		if err != nil {
			return fmt.Errorf("module %s: %w", rel, err)
		}
		name := ModuleName(rel)
		k.paths[name] = rel
		for _, d := range strings.Split(info["depends"], ",") {
			if d != "" {
				k.deps[name] = append(k.deps[name], ModuleName(d))
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if b, err := os.Open(filepath.Join(dir, "modules.builtin")); err == nil {
		defer b.Close()
		sc := bufio.NewScanner(b)
		for sc.Scan() {
			k.builtin[ModuleName(sc.Text())] = true
		}
	}
	return nil
}

// readModinfo returns the key=value pairs of a module's .modinfo section.
func readModinfo(path string) (map[string]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("no .modinfo section")
	}
	data, err := sec.Data()
	if err != nil {
		return nil, err
	}
	return parseModinfo(data), nil
}

// parseModinfo splits NUL-separated "key=value" strings; later keys (e.g. repeated "alias") overwrite.
func parseModinfo(data []byte) map[string]string {
	m := map[string]string{}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok {
			m[k] = v
		}
	}
	return m
}

// Modules returns the files (relative to ModulesDir) of the named modules and all their dependencies, in an
// order that loads every dependency before its users. Built-in modules are skipped: nothing to load.
func (k *Kernel) Modules(names ...string) ([]string, error) {
	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(n string, from string) error
	visit = func(n, from string) error {
		switch state[n] {
		case 1:
			return fmt.Errorf("module dependency cycle at %s", n)
		case 2:
			return nil
		}
		if _, ok := k.paths[n]; !ok {
			if k.builtin[n] {
				state[n] = 2
				return nil
			}
			if from != "" {
				return fmt.Errorf("module %s (needed by %s) not in kernel %s", n, from, k.Release)
			}
			return fmt.Errorf("module %q not in kernel %s (neither loadable nor built in)", n, k.Release)
		}
		state[n] = 1
		deps := append([]string(nil), k.deps[n]...)
		sort.Strings(deps) // deterministic order keeps cache keys stable
		for _, d := range deps {
			if err := visit(d, n); err != nil {
				return err
			}
		}
		state[n] = 2
		order = append(order, k.paths[n])
		return nil
	}
	for _, n := range names {
		if err := visit(ModuleName(n), ""); err != nil {
			return nil, err
		}
	}
	return order, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// FileSHA256 returns the hex sha256 of a file's contents (used for cache keys).
func FileSHA256(path string) (string, error) { return fileSHA256(path) }
