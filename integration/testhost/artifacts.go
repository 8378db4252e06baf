package testhost

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/cube-runtime/cube/contrib/guestimage"
)

//go:embed stage1.sh
var stage1Script []byte

//go:embed stage2.sh
var stage2Script []byte

// bootModules are what stage 1 needs to find its root disk; kvmModules what every test host loads.
var (
	bootModules = []string{"virtio_pci", "virtio_blk"}
	kvmModules  = []string{"kvm_amd"}
)

// artifacts are the cached, input-keyed parts of a test host: kernel, initramfs and the base root tree.
type artifacts struct {
	Key       string
	Vmlinuz   string
	Initramfs string
	BaseTree  string // busybox, modules, tools with their libraries, /cube/stage2
	Kernel    *guestimage.Kernel
	Modules   []string // what stage 2 loads, in order: paths relative to the kernel's modules directory
}

// buildArtifacts returns the artifacts for opts, building them under cacheDir only when their inputs changed.
func buildArtifacts(ctx context.Context, cacheDir string, opts *Options, logf func(string, ...any)) (*artifacts, error) {
	k, err := guestimage.FetchKernel(ctx, cacheDir)
	if err != nil {
		return nil, fmt.Errorf("test host kernel: %w", err)
	}
	busybox, err := findBusybox()
	if err != nil {
		return nil, err
	}
	bootMods, err := k.Modules(bootModules...)
	if err != nil {
		return nil, fmt.Errorf("test host boot modules: %w", err)
	}
	mods, err := k.Modules(append(append([]string{}, kvmModules...), opts.Modules...)...)
	if err != nil {
		return nil, fmt.Errorf("test host modules (Options.Modules): %w", err)
	}
	// Stage 1 loaded the boot modules; insmod refuses a second load (virtio_net needs virtio_ring, say).
	mods = slices.DeleteFunc(mods, func(m string) bool { return slices.Contains(bootMods, m) })
	tools, err := resolveTools(opts.Tools)
	if err != nil {
		return nil, err
	}
	// A rebuilt kvm-amd.ko (Platform.KVMAMD) replaces the package's own in the base tree.
	replace := map[string]string{}
	if v := opts.Platform.KVMAMD; v != "" && v != KVMAMDStock {
		ko, err := buildKVMAMD(ctx, cacheDir, k, v, logf)
		if err != nil {
			return nil, fmt.Errorf("test host kvm-amd %s: %w", v, err)
		}
		for _, m := range mods {
			if moduleName(m) == "kvm_amd" {
				replace[m] = ko
			}
		}
	}

	// The key covers every input: a change in any of them builds new artifacts beside the old ones.
	h := sha256.New()
	fmt.Fprintf(h, "layout 1\nkernel %s\n", k.DebHash)
	for _, f := range []string{busybox} {
		if err := hashFile(h, f); err != nil {
			return nil, err
		}
	}
	h.Write(stage1Script)
	h.Write(stage2Script)
	fmt.Fprintf(h, "boot %v\nmods %v\n", bootMods, mods)
	for m, f := range replace {
		fmt.Fprintf(h, "replace %s\n", m)
		if err := hashFile(h, f); err != nil {
			return nil, err
		}
	}
	for _, t := range tools {
		fmt.Fprintf(h, "tool %s\n", t)
		if err := hashFile(h, t); err != nil {
			return nil, err
		}
	}
	key := hex.EncodeToString(h.Sum(nil))[:20]
	dir := filepath.Join(cacheDir, "testhost", key)
	a := &artifacts{
		Key: key, Kernel: k, Vmlinuz: k.Vmlinuz,
		Initramfs: filepath.Join(dir, "initramfs.cpio.gz"),
		BaseTree:  filepath.Join(dir, "root"),
		Modules:   mods,
	}
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err == nil {
		logf("test host artifacts %s: cached in %s", key, dir)
		return a, nil
	}
	logf("test host artifacts %s: building in %s (kernel %s)", key, dir, k.Release)
	// A unique temporary name: several test runs may fill one cache at once.
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), key+".tmp-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	if err := writeInitramfs(filepath.Join(tmp, "initramfs.cpio.gz"), k, busybox, bootMods); err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	if err := writeBaseTree(filepath.Join(tmp, "root"), k, busybox, mods, replace, tools); err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(tmp, ".complete"), nil, 0o644); err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	if err := guestimage.PublishDir(tmp, dir); err != nil {
		return nil, err
	}
	return a, nil
}

func findBusybox() (string, error) {
	for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			libs, err := guestimage.SharedLibs(p)
			if err == nil && len(libs) == 0 {
				return p, nil
			}
		}
	}
	return "", fmt.Errorf("a static busybox is needed for the test host: install it with `apt-get install busybox-static`")
}

func resolveTools(names []string) ([]string, error) {
	var out []string
	for _, n := range names {
		p := n
		if !filepath.IsAbs(n) {
			var err error
			if p, err = exec.LookPath(n); err != nil {
				return nil, fmt.Errorf("tool %q for the test host (Options.Tools) is not installed on this machine: %w", n, err)
			}
		}
		p, err := filepath.Abs(p)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	sort.Strings(out)
	return out, nil
}

func hashFile(w io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

func writeInitramfs(dst string, k *guestimage.Kernel, busybox string, mods []string) error {
	r := guestimage.NewInitramfs()
	if err := r.File("bin/busybox", busybox); err != nil {
		return err
	}
	if err := r.Bytes("init", stage1Script, 0o755); err != nil {
		return err
	}
	var order []string
	for _, m := range mods {
		name := filepath.Base(m)
		if err := r.File("modules/"+name, filepath.Join(k.ModulesDir(), m)); err != nil {
			return err
		}
		order = append(order, name)
	}
	if err := r.Bytes("modules.order", []byte(strings.Join(order, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := r.WriteTo(&buf, true); err != nil {
		return err
	}
	return os.WriteFile(dst, buf.Bytes(), 0o644)
}

var etcFiles = map[string]string{
	"etc/passwd":   "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
	"etc/group":    "root:x:0:\nnogroup:x:65534:\n",
	"etc/hosts":    "127.0.0.1 localhost cube-testhost\n",
	"etc/hostname": "cube-testhost\n",
}

// replace maps a module (as in mods) to a rebuilt file used instead of the package's own.
func writeBaseTree(root string, k *guestimage.Kernel, busybox string, mods []string, replace map[string]string, tools []string) error {
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "usr/local/bin", "etc", "root", "proc", "sys", "dev", "run", "tmp", "var/tmp", "cube/work", "cube/payload/bin"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	if err := copyFile(busybox, filepath.Join(root, "bin/busybox")); err != nil {
		return err
	}
	applets, err := exec.Command(busybox, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("busybox --list-full: %w", err)
	}
	for _, a := range strings.Fields(string(applets)) {
		p := filepath.Join(root, a)
		if a == "bin/busybox" || !strings.Contains(a, "/") {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.Symlink("/bin/busybox", p); err != nil && !os.IsExist(err) {
			return err
		}
	}
	for p, content := range etcFiles {
		if err := os.WriteFile(filepath.Join(root, p), []byte(content), 0o644); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(root, "cube/stage2"), stage2Script, 0o755); err != nil {
		return err
	}
	for _, m := range mods {
		src := filepath.Join(k.ModulesDir(), m)
		if r, ok := replace[m]; ok {
			src = r
		}
		if err := copyFile(src, filepath.Join(root, "lib/modules", k.Release, m)); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(root, "cube/modules.order"), []byte(strings.Join(mods, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	for _, t := range tools {
		if err := installWithLibs(root, t, t); err != nil {
			return err
		}
	}
	return nil
}

// installWithLibs copies the host program src to dst inside root, with the shared libraries it needs at their
// host paths (so its ELF interpreter and rpaths resolve the same way inside).
func installWithLibs(root, src, dst string) error {
	if err := os.Remove(filepath.Join(root, dst)); err != nil && !os.IsNotExist(err) {
		return err // a busybox applet link of the same name gives way to the real tool
	}
	if err := copyFile(src, filepath.Join(root, dst)); err != nil {
		return err
	}
	return installLibs(root, src)
}

// installLibs copies the shared libraries the host program src needs into root at their host paths.
func installLibs(root, src string) error {
	libs, err := guestimage.SharedLibs(src)
	if err != nil {
		return err
	}
	for _, l := range libs {
		real, err := filepath.EvalSymlinks(l)
		if err != nil {
			return err
		}
		if _, err := os.Lstat(filepath.Join(root, l)); err == nil {
			continue
		}
		if err := copyFile(real, filepath.Join(root, l)); err != nil {
			return err
		}
	}
	return nil
}

// copyFile copies contents and permission bits, creating parent directories.
func copyFile(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, st.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return out.Close()
}
