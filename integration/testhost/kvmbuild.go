package testhost

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/cube-runtime/cube/contrib/guestimage"
)

// KVMAMD variants of the test host's kvm-amd module.
const (
	KVMAMDStock    = "stock"     // the kernel package's own kvm-amd.ko
	KVMAMDSTIVMRUN = "sti-vmrun" // rebuilt from Debian's linux-source with IF=1 only in VMRUN's STI shadow
)

// stockKVMAMD is where the kernel package keeps its kvm-amd.ko, relative to its modules dir.
const stockKVMAMD = "kernel/arch/x86/kvm/kvm-amd.ko"

// textPatch is one exact replacement in a kernel source file (path relative to arch/x86/kvm). Old must occur
// exactly once: a kernel whose lines differ must fail the build, not yield a silently unpatched module.
type textPatch struct {
	File, Old, New string
}

// stiVMRUNPatch is the sti-vmrun experiment. The test host kernel (QEMU/TCG, emulated SVM) now and then takes
// a #PF recursion on a %gs-relative per-CPU load in a KVM_RUN thread, before the host GS base is restored
// after #VMEXIT. Since Linux 6.1.149 ("KVM: SVM: Set RFLAGS.IF=1 in C code, to get VMRUN out of the STI
// shadow") svm_vcpu_enter_exit() sets IF=1 around the whole VMLOAD(guest)…VMRUN…VMSAVE…VMLOAD(host)
// sequence and relies on GIF=0 alone to keep interrupts out. If TCG delivers an interrupt with GIF=0, that
// is exactly the crash. This restores the pre-6.1.149 behaviour: IF stays 0 in C, and vmenter.S does STI
// right before VMRUN and CLI right after it, so IF=1 only in VMRUN's STI shadow (the CLI sits after the
// exit label the VMRUN fault fixup jumps back to, so it runs on that path too, as it did before 6.1.149).
var stiVMRUNPatch = []textPatch{
	{"svm/svm.c",
		"\traw_local_irq_enable();\n\n\tamd_clear_divider();\n",
		"\t/* cube sti-vmrun: IF=1 only in VMRUN's STI shadow, see svm/vmenter.S. */\n\n\tamd_clear_divider();\n"},
	{"svm/svm.c",
		"\t\t__svm_vcpu_run(svm, spec_ctrl_intercepted);\n\n\traw_local_irq_disable();\n\n\tguest_state_exit_irqoff();\n",
		"\t\t__svm_vcpu_run(svm, spec_ctrl_intercepted);\n\n\tguest_state_exit_irqoff();\n"},
	{"svm/vmenter.S",
		"3:\tvmrun %_ASM_AX\n4:\n",
		"\tsti\n3:\tvmrun %_ASM_AX\n4:\tcli\n"},
	{"svm/vmenter.S",
		"1:\tvmrun %_ASM_AX\n2:\n",
		"\tsti\n1:\tvmrun %_ASM_AX\n2:\tcli\n"},
}

// kvmAMDKbuild builds only kvm-amd.ko out of tree against the packaged headers. It follows the kvm-amd
// lines of arch/x86/kvm/Makefile; the config conditionals come from the headers' auto.conf, which kbuild
// includes. -I$(src) replaces upstream's -I $(srctree)/arch/x86/kvm: the headers tree has no arch/x86/kvm.
const kvmAMDKbuild = `# Written by cube's integration/testhost/kvmbuild.go.
ccflags-y += -I$(src)
ccflags-$(CONFIG_KVM_WERROR) += -Werror
ifeq ($(CONFIG_FRAME_POINTER),y)
OBJECT_FILES_NON_STANDARD_vmenter.o := y
endif
kvm-amd-y := svm/svm.o svm/vmenter.o svm/pmu.o svm/nested.o svm/avic.o svm/sev.o
ifdef CONFIG_HYPERV
kvm-amd-y += svm/svm_onhyperv.o
endif
obj-m := kvm-amd.o
AFLAGS_svm/vmenter.o := -iquote $(obj)
$(obj)/svm/vmenter.o: $(obj)/kvm-asm-offsets.h
$(obj)/kvm-asm-offsets.h: $(obj)/kvm-asm-offsets.s FORCE
	$(call filechk,offsets,__KVM_ASM_OFFSETS_H__)
targets += kvm-asm-offsets.s
`

// kvmBuildFormat is part of the cache key: bump it when the build procedure changes in ways the other
// inputs do not show.
const kvmBuildFormat = "1"

// patchText applies the patches for file (a path under tree, named in errors) to src. Every expected text
// must occur exactly once.
func patchText(tree, file, src string, patches []textPatch) (string, error) {
	for _, p := range patches {
		if p.File != file {
			continue
		}
		if n := strings.Count(src, p.Old); n != 1 {
			return "", fmt.Errorf("patch %s/%s: expected exactly one occurrence of %q, found %d: this source differs from the one the patch was written for; re-derive the patch in integration/testhost", tree, file, p.Old, n)
		}
		src = strings.Replace(src, p.Old, p.New, 1)
	}
	return src, nil
}

// patchFiles applies patches to the files under dir (tree is how errors name it).
func patchFiles(dir, tree string, patches []textPatch) error {
	for _, f := range uniqueFiles(patches) {
		path := filepath.Join(dir, f)
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("patch %s/%s: %w", tree, f, err)
		}
		out, err := patchText(tree, f, string(b), patches)
		if err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// kvmSourcePackages are the Debian packages a kvm-amd rebuild needs, all at the kernel package's version.
type kvmSourcePackages struct {
	Version string // e.g. 6.1.192-3
	Series  string // e.g. 6.1
	Source  string // linux-source-6.1: the kernel tree as a tar.xz
	Headers string // linux-headers-<release>: config, Module.symvers, generated headers
	Common  string // linux-headers-<abi>-common: the flavour-independent headers and top Makefile
	Kbuild  string // linux-kbuild-6.1: scripts and objtool
}

func (p kvmSourcePackages) names() []string { return []string{p.Source, p.Headers, p.Common, p.Kbuild} }

// kvmPackages derives the package names from a Debian kernel release "<x.y.z>-<abi>-<flavour>".
func kvmPackages(release, version string) (kvmSourcePackages, error) {
	f := strings.SplitN(release, "-", 3)
	nums := strings.Split(f[0], ".")
	if len(f) != 3 || len(nums) < 2 || version == "" {
		return kvmSourcePackages{}, fmt.Errorf("kernel release %q (version %q) is not a Debian <x.y.z>-<abi>-<flavour> release: cannot name its source and headers packages", release, version)
	}
	series := nums[0] + "." + nums[1]
	return kvmSourcePackages{
		Version: version,
		Series:  series,
		Source:  "linux-source-" + series,
		Headers: "linux-headers-" + release,
		Common:  "linux-headers-" + f[0] + "-" + f[1] + "-common",
		Kbuild:  "linux-kbuild-" + series,
	}, nil
}

// fetchDebs returns the .deb of each package at version, from dir or downloaded into it with apt-get.
func fetchDebs(ctx context.Context, dir, version string, names []string, logf func(string, ...any)) (map[string]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// apt-get writes an epoch's colon as %3a in file names.
	fileVersion := strings.ReplaceAll(version, ":", "%3a")
	debs := map[string]string{}
	var missing []string
	for _, n := range names {
		if m, _ := filepath.Glob(filepath.Join(dir, n+"_"+fileVersion+"_*.deb")); len(m) > 0 {
			debs[n] = m[0]
		} else {
			missing = append(missing, n+"="+version)
		}
	}
	if len(missing) == 0 {
		return debs, nil
	}
	howto := fmt.Sprintf("run `apt-get update && cd %s && apt-get download %s` on a machine that reaches Debian's archive (bookworm-security has the newest kernels)", dir, strings.Join(missing, " "))
	if _, err := exec.LookPath("apt-get"); err != nil {
		return nil, fmt.Errorf("packages %s are not in %s and apt-get is missing: %s", strings.Join(missing, ", "), dir, howto)
	}
	logf("kvm-amd: downloading %s into %s", strings.Join(missing, " "), dir)
	for _, spec := range missing {
		// A unique directory per download: concurrent callers must not see each other's partial files.
		tmp, err := os.MkdirTemp(dir, "download-")
		if err != nil {
			return nil, err
		}
		os.Chmod(tmp, 0o755) // so apt's _apt user can write there (apt warns otherwise)
		cmd := exec.CommandContext(ctx, "apt-get", "download", "-q", spec)
		cmd.Dir = tmp
		out, err := cmd.CombinedOutput()
		got, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
		if err != nil || len(got) != 1 {
			os.RemoveAll(tmp)
			return nil, fmt.Errorf("download %s: %v: %s\npackages needed: %s; to fetch them: %s", spec, err, strings.TrimSpace(string(out)), strings.Join(missing, " "), howto)
		}
		dst := filepath.Join(dir, filepath.Base(got[0]))
		err = os.Rename(got[0], dst)
		os.RemoveAll(tmp)
		if err != nil {
			return nil, err
		}
		debs[strings.SplitN(spec, "=", 2)[0]] = dst
	}
	return debs, nil
}

// readDebFile returns one file of a .deb's data archive (name as in the archive, "./usr/...").
func readDebFile(ctx context.Context, deb, name string) ([]byte, error) {
	var found []byte
	err := walkDebData(ctx, deb, func(h *tar.Header, r io.Reader) (bool, error) {
		if h.Name != name {
			return false, nil
		}
		var err error
		found, err = io.ReadAll(r)
		return true, err
	})
	if err == nil && found == nil {
		err = fmt.Errorf("%s has no %s", deb, name)
	}
	return found, err
}

// walkDebData calls fn for each entry of a .deb's data archive until fn reports it is done.
func walkDebData(ctx context.Context, deb string, fn func(*tar.Header, io.Reader) (done bool, err error)) error {
	cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", deb)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w", deb, err)
	}
	tr := tar.NewReader(out)
	var ferr error
	for {
		h, err := tr.Next()
		if err != nil {
			if err != io.EOF {
				ferr = fmt.Errorf("read %s: %w", deb, err)
			}
			break
		}
		done, err := fn(h, tr)
		if err != nil || done {
			ferr = err
			break
		}
	}
	io.Copy(io.Discard, out) // let dpkg-deb finish rather than die of SIGPIPE
	if err := cmd.Wait(); err != nil && ferr == nil {
		ferr = fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w: %s", deb, err, stderr.String())
	}
	return ferr
}

// parseKconfig returns the CONFIG_ values of an auto.conf, unquoted.
func parseKconfig(b []byte) map[string]string {
	m := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok && strings.HasPrefix(k, "CONFIG_") {
			m[k] = strings.Trim(v, `"`)
		}
	}
	return m
}

// moduleInfo returns the key=value pairs of a module's .modinfo ELF section (what modinfo prints).
func moduleInfo(path string) (map[string]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read module %s: %w", path, err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("module %s has no .modinfo section", path)
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("read .modinfo of %s: %w", path, err)
	}
	m := map[string]string{}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok {
			m[k] = v
		}
	}
	return m, nil
}

// moduleVermagic returns a module's vermagic: the kernel refuses a module whose vermagic differs from its own.
func moduleVermagic(path string) (string, error) {
	info, err := moduleInfo(path)
	if err != nil {
		return "", err
	}
	v, ok := info["vermagic"]
	if !ok {
		return "", fmt.Errorf("module %s has no vermagic in .modinfo", path)
	}
	return v, nil
}

// needTools fails naming the Debian package to install for the first missing command.
func needTools(tools [][2]string) error {
	for _, t := range tools {
		if _, err := exec.LookPath(t[0]); err != nil {
			return fmt.Errorf("rebuilding kvm-amd needs %s: install the Debian package %s (apt-get install %s)", t[0], t[1], t[1])
		}
	}
	return nil
}

// buildKVMAMD returns the path of a kvm-amd.ko for kernel k built as variant, cached under
// cacheDir/kvm-amd/<key>/kvm-amd.ko where key hashes every input: the source, headers and kbuild .debs,
// the patch, the Kbuild text and the compiler version. It is built once; concurrent callers each build in
// their own temporary directory and the first to publish wins. KVMAMDStock returns the package's module.
func buildKVMAMD(ctx context.Context, cacheDir string, k *guestimage.Kernel, variant string, logf func(string, ...any)) (string, error) {
	stock := filepath.Join(k.ModulesDir(), stockKVMAMD)
	var patches []textPatch
	switch variant {
	case KVMAMDStock:
		return stock, nil
	case KVMAMDSTIVMRUN:
		patches = stiVMRUNPatch
	default:
		return "", fmt.Errorf("unknown kvm-amd variant %q: use %q or %q", variant, KVMAMDStock, KVMAMDSTIVMRUN)
	}
	if err := needTools([][2]string{{"dpkg-deb", "dpkg"}, {"tar", "tar"}, {"xz", "xz-utils"}, {"make", "make"}, {"gcc", "gcc"}}); err != nil {
		return "", err
	}
	out, err := exec.CommandContext(ctx, "dpkg-deb", "-f", k.Deb, "Version").Output()
	if err != nil {
		return "", fmt.Errorf("read the Version of kernel package %s: %w", k.Deb, err)
	}
	pkgs, err := kvmPackages(k.Release, strings.TrimSpace(string(out)))
	if err != nil {
		return "", err
	}
	debs, err := fetchDebs(ctx, filepath.Join(cacheDir, "debs"), pkgs.Version, pkgs.names(), logf)
	if err != nil {
		return "", err
	}

	// The compiler is the one the kernel was built with (its auto.conf names it; Debian's headers set
	// CC to it too): a module from another compiler may differ in ways vermagic does not show.
	headersDir := "./usr/src/" + pkgs.Headers
	autoConf, err := readDebFile(ctx, debs[pkgs.Headers], headersDir+"/include/config/auto.conf")
	if err != nil {
		return "", fmt.Errorf("read the kernel config: %w", err)
	}
	config := parseKconfig(autoConf)
	ccText := config["CONFIG_CC_VERSION_TEXT"]
	cc, _, _ := strings.Cut(ccText, " ")
	if cc == "" {
		return "", fmt.Errorf("%s: auto.conf has no CONFIG_CC_VERSION_TEXT naming the kernel's compiler", debs[pkgs.Headers])
	}
	if err := needTools([][2]string{{cc, cc}}); err != nil {
		return "", err
	}
	ccVersion, err := exec.CommandContext(ctx, cc, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", cc, err)
	}
	if first, _, _ := strings.Cut(string(ccVersion), "\n"); first != ccText {
		logf("kvm-amd: warning: the kernel was built with %q, this machine has %q", ccText, first)
	}

	h := sha256.New()
	fmt.Fprintf(h, "format %s\nvariant %s\npatch %q\nkbuild %q\ncc %s\n", kvmBuildFormat, variant, patches, kvmAMDKbuild, ccVersion)
	for _, n := range pkgs.names() {
		sum, err := guestimage.FileSHA256(debs[n])
		if err != nil {
			return "", fmt.Errorf("hash %s: %w", debs[n], err)
		}
		fmt.Fprintf(h, "deb %s %s\n", n, sum)
	}
	key := hex.EncodeToString(h.Sum(nil))[:16]
	dir := filepath.Join(cacheDir, "kvm-amd", key)
	ko := filepath.Join(dir, "kvm-amd.ko")
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err == nil {
		logf("kvm-amd %s for %s: cached %s", variant, k.Release, ko)
		return ko, nil
	}

	start := time.Now()
	logf("kvm-amd %s for %s: building from %s=%s (key %s)", variant, k.Release, pkgs.Source, pkgs.Version, key)
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
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
	built, err := buildKVMAMDIn(ctx, work, res, pkgs, debs, patches, runtime.NumCPU())
	if err != nil {
		return "", fmt.Errorf("build kvm-amd %s for %s: %w", variant, k.Release, err)
	}

	want, err := moduleVermagic(stock)
	if err != nil {
		return "", fmt.Errorf("stock kvm-amd of %s: %w", k.Release, err)
	}
	got, err := moduleVermagic(built)
	if err != nil {
		return "", err
	}
	if got != want {
		return "", fmt.Errorf("rebuilt kvm-amd has vermagic %q, the kernel's own module %q: the kernel would refuse it; are %s and the kernel package %s the same build?", got, want, debs[pkgs.Headers], k.Deb)
	}
	if err := os.WriteFile(filepath.Join(res, ".complete"), nil, 0o644); err != nil {
		return "", err
	}
	if err := guestimage.PublishDir(res, dir); err != nil {
		return "", err
	}
	published = true
	logf("kvm-amd %s for %s: built in %s: %s", variant, k.Release, time.Since(start).Round(100*time.Millisecond), ko)
	return ko, nil
}

// buildKVMAMDIn unpacks the packages into work, patches and builds kvm-amd.ko, and leaves in res the module,
// the build log and the patched sources (to show what was built). It returns the module's path.
func buildKVMAMDIn(ctx context.Context, work, res string, pkgs kvmSourcePackages, debs map[string]string, patches []textPatch, jobs int) (string, error) {
	root := filepath.Join(work, "root")
	for _, n := range []string{pkgs.Headers, pkgs.Common, pkgs.Kbuild} {
		if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", debs[n], root).CombinedOutput(); err != nil {
			return "", fmt.Errorf("unpack %s: %w: %s", debs[n], err, out)
		}
	}
	// The flavour's Makefile includes the common one by its installed, absolute path; point it at ours.
	// Its scripts and tools symlinks are relative and resolve inside root already.
	headers := filepath.Join(root, "usr/src", pkgs.Headers)
	commonDir := filepath.Join(root, "usr/src", pkgs.Common)
	mk := filepath.Join(headers, "Makefile")
	b, err := os.ReadFile(mk)
	if err != nil {
		return "", err
	}
	include := "include /usr/src/" + pkgs.Common + "/Makefile"
	if !strings.Contains(string(b), include) {
		return "", fmt.Errorf("%s (from %s) does not contain %q: the headers package layout changed; adapt buildKVMAMDIn", mk, debs[pkgs.Headers], include)
	}
	b = []byte(strings.Replace(string(b), include, "include "+commonDir+"/Makefile", 1))
	if err := os.WriteFile(mk, b, 0o644); err != nil {
		return "", err
	}

	src := filepath.Join(work, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	member := "linux-source-" + pkgs.Series + "/arch/x86/kvm"
	if err := extractSourceSubtree(ctx, debs[pkgs.Source], "./usr/src/linux-source-"+pkgs.Series+".tar.xz", src, member); err != nil {
		return "", err
	}
	kvmDir := filepath.Join(src, member)
	if err := patchFiles(kvmDir, "arch/x86/kvm", patches); err != nil {
		return "", err
	}
	// kbuild reads Kbuild in preference to the tree's own Makefile (which would build kvm.ko too).
	if err := os.WriteFile(filepath.Join(kvmDir, "Kbuild"), []byte(kvmAMDKbuild), 0o644); err != nil {
		return "", err
	}

	cmd := exec.CommandContext(ctx, "make", "-C", headers, "M="+kvmDir, fmt.Sprintf("-j%d", jobs), "modules")
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	if werr := os.WriteFile(filepath.Join(res, "build.log"), out, 0o644); werr != nil {
		return "", werr
	}
	if err != nil {
		return "", fmt.Errorf("make modules in %s: %w:\n%s", kvmDir, err, TailLines(out, 40))
	}
	for _, f := range append(uniqueFiles(patches), "kvm-amd.ko", "Kbuild") {
		data, err := os.ReadFile(filepath.Join(kvmDir, f))
		if err != nil {
			return "", fmt.Errorf("after make: %w", err)
		}
		dst := filepath.Join(res, filepath.Base(f))
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			return "", err
		}
	}
	return filepath.Join(res, "kvm-amd.ko"), nil
}

func uniqueFiles(patches []textPatch) []string {
	var files []string
	seen := map[string]bool{}
	for _, p := range patches {
		if !seen[p.File] {
			seen[p.File] = true
			files = append(files, p.File)
		}
	}
	return files
}

// extractSourceSubtree extracts member (a directory) of the tar.xz tarball inside deb into dst. The
// decompression dominates (the source is ~1.3 GB unpacked): xz -T0 spreads it over the CPUs, and only
// the subtree is written.
func extractSourceSubtree(ctx context.Context, deb, tarball, dst, member string) error {
	found := false
	err := walkDebData(ctx, deb, func(h *tar.Header, r io.Reader) (bool, error) {
		if h.Name != tarball {
			return false, nil
		}
		found = true
		xz := exec.CommandContext(ctx, "xz", "-dc", "-T0")
		xz.Stdin = r
		var xzErr, tarErr bytes.Buffer
		xz.Stderr = &xzErr
		pipe, err := xz.StdoutPipe()
		if err != nil {
			return true, err
		}
		untar := exec.CommandContext(ctx, "tar", "-x", "-C", dst, "-f", "-", member)
		untar.Stdin = pipe
		untar.Stderr = &tarErr
		if err := xz.Start(); err != nil {
			return true, fmt.Errorf("xz: %w", err)
		}
		if err := untar.Start(); err != nil {
			xz.Process.Kill()
			xz.Wait()
			return true, fmt.Errorf("tar: %w", err)
		}
		terr := untar.Wait()
		if terr != nil {
			xz.Process.Kill()
		}
		xerr := xz.Wait()
		if terr != nil {
			return true, fmt.Errorf("extract %s from %s: tar: %w: %s", member, tarball, terr, tarErr.String())
		}
		if xerr != nil {
			return true, fmt.Errorf("extract %s from %s: xz: %w: %s", member, tarball, xerr, xzErr.String())
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", deb, err)
	}
	if !found {
		return fmt.Errorf("%s has no %s: the linux-source package layout changed; adapt extractSourceSubtree", deb, tarball)
	}
	if _, err := os.Stat(filepath.Join(dst, member)); err != nil {
		return fmt.Errorf("%s: %s contains no %s", deb, tarball, member)
	}
	return nil
}
