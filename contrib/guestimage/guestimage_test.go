package guestimage

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cavaliergopher/cpio"
)

func TestParseModinfo(t *testing.T) {
	m := parseModinfo([]byte("license=GPL\x00depends=kvm,irqbypass\x00\x00name=kvm_amd\x00garbage\x00"))
	if m["depends"] != "kvm,irqbypass" || m["name"] != "kvm_amd" || m["license"] != "GPL" {
		t.Fatalf("parseModinfo = %v", m)
	}
	if len(parseModinfo(nil)) != 0 {
		t.Fatal("empty modinfo should give no keys")
	}
}

func testKernel() *Kernel {
	return &Kernel{
		Release: "test",
		paths: map[string]string{
			"kvm_amd": "kernel/arch/x86/kvm/kvm-amd.ko", "kvm": "kernel/arch/x86/kvm/kvm.ko",
			"irqbypass": "kernel/virt/lib/irqbypass.ko", "a": "a.ko", "b": "b.ko",
		},
		deps: map[string][]string{
			"kvm_amd": {"kvm", "irqbypass"}, "kvm": {"irqbypass"},
			"a": {"b"}, "b": {"a"},
		},
		builtin: map[string]bool{"ext4": true},
	}
}

func TestModulesOrderDependenciesFirst(t *testing.T) {
	got, err := testKernel().Modules("kvm-amd", "ext4", "kvm")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"kernel/virt/lib/irqbypass.ko", "kernel/arch/x86/kvm/kvm.ko", "kernel/arch/x86/kvm/kvm-amd.ko"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Modules = %v, want %v", got, want)
	}
}

func TestModulesErrors(t *testing.T) {
	k := testKernel()
	if _, err := k.Modules("nosuch"); err == nil || !strings.Contains(err.Error(), `"nosuch" not in kernel`) {
		t.Fatalf("unknown module: err = %v", err)
	}
	if _, err := k.Modules("a"); err == nil || !strings.Contains(err.Error(), "cycle") {
		t.Fatalf("cycle: err = %v", err)
	}
	k.deps["kvm"] = []string{"gone"}
	if _, err := k.Modules("kvm"); err == nil || !strings.Contains(err.Error(), "gone (needed by kvm)") {
		t.Fatalf("missing dependency: err = %v", err)
	}
}

func TestParseLdd(t *testing.T) {
	out := []byte("\tlinux-vdso.so.1 (0x00007ffd)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n")
	got, err := parseLdd(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("parseLdd = %v, want %v", got, want)
	}
	if _, err := parseLdd([]byte("\tlibfoo.so.1 => not found\n")); err == nil {
		t.Fatal("a missing library must be an error")
	}
}

func TestSharedLibsOfScriptAndSelf(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "s.sh")
	os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755)
	if libs, err := SharedLibs(script); err != nil || libs != nil {
		t.Fatalf("script: libs %v err %v", libs, err)
	}
	if _, err := os.Stat("/bin/sh"); err == nil {
		libs, err := SharedLibs("/bin/sh")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range libs {
			if !filepath.IsAbs(l) {
				t.Fatalf("relative library path %q", l)
			}
		}
	}
}

func TestInitramfsRoundTrip(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "prog")
	os.WriteFile(src, []byte("binary"), 0o750)
	r := NewInitramfs()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(r.File("bin/prog", src))
	must(r.Bytes("/init", []byte("#!/bin/sh\n"), 0o755))
	must(r.Symlink("sbin/init", "/init"))
	must(r.Dir("proc", 0o555))
	if err := r.Bytes("/", nil, 0o644); err == nil {
		t.Fatal("empty path accepted")
	}
	if err := r.File("x", filepath.Join(dir, "missing")); err == nil {
		t.Fatal("missing source accepted")
	}
	var a, b bytes.Buffer
	must(r.WriteTo(&a, false))
	must(r.WriteTo(&b, false))
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("archive is not reproducible")
	}
	got := map[string]string{}
	modes := map[string]cpio.FileMode{}
	cr := cpio.NewReader(&a)
	for {
		h, err := cr.Next()
		if err == io.EOF {
			break
		}
		must(err)
		data, _ := io.ReadAll(cr)
		if h.Mode&cpio.ModeType == cpio.TypeSymlink {
			data = []byte(h.Linkname) // the reader moves a link's body into Linkname
		}
		got[h.Name] = string(data)
		modes[h.Name] = h.Mode
	}
	want := map[string]string{"bin": "", "bin/prog": "binary", "init": "#!/bin/sh\n", "sbin": "", "sbin/init": "/init", "proc": ""}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("archive = %v, want %v", got, want)
	}
	if modes["bin/prog"] != cpio.TypeReg|0o750 || modes["sbin/init"]&cpio.ModeType != cpio.TypeSymlink || modes["proc"] != cpio.TypeDir|0o555 {
		t.Fatalf("modes = %v", modes)
	}
}

func TestWriteGuestInitramfsRefusesDynamicInit(t *testing.T) {
	k := testKernel()
	var buf bytes.Buffer
	if _, err := WriteGuestInitramfs(k, GuestSpec{}, &buf); err == nil {
		t.Fatal("missing init accepted")
	}
	if libs, _ := SharedLibs("/bin/sh"); len(libs) > 0 {
		_, err := WriteGuestInitramfs(k, GuestSpec{Init: "/bin/sh"}, &buf)
		if err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
			t.Fatalf("dynamic init: err = %v", err)
		}
	}
}

func TestWriteGuestInitramfsLayout(t *testing.T) {
	dir := t.TempDir()
	k := testKernel()
	k.Root = dir
	for _, m := range []string{"kernel/arch/x86/kvm/kvm.ko", "kernel/virt/lib/irqbypass.ko"} {
		p := filepath.Join(k.ModulesDir(), m)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(m), 0o644)
	}
	init := filepath.Join(dir, "init")
	os.WriteFile(init, []byte("#!/bin/sh\n"), 0o755) // a script has no ELF libraries
	var buf bytes.Buffer
	mods, err := WriteGuestInitramfs(k, GuestSpec{Init: init, Modules: []string{"kvm"}}, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(mods, []string{"kernel/virt/lib/irqbypass.ko", "kernel/arch/x86/kvm/kvm.ko"}) {
		t.Fatalf("mods = %v", mods)
	}
	gz, err := gzip.NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	cr := cpio.NewReader(gz)
	names := map[string]bool{}
	for {
		h, err := cr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names[h.Name] = true
	}
	for _, want := range []string{"init", "proc", "dev", "lib/modules/test/kernel/arch/x86/kvm/kvm.ko", "lib/modules/test/kernel/virt/lib/irqbypass.ko"} {
		if !names[want] {
			t.Errorf("initramfs lacks %s (has %v)", want, names)
		}
	}
}

func TestInitramfsProgramBringsLibraries(t *testing.T) {
	libs, err := SharedLibs("/bin/sh")
	if err != nil || len(libs) == 0 {
		t.Skipf("/bin/sh is not a dynamic executable here (%v): nothing to check", err)
	}
	r := NewInitramfs()
	if err := r.Program("bin/sh", "/bin/sh"); err != nil {
		t.Fatal(err)
	}
	for _, l := range append(libs, "/bin/sh") {
		name := strings.TrimPrefix(l, "/")
		if l == "/bin/sh" {
			name = "bin/sh"
		}
		if _, ok := r.entries[name]; !ok {
			t.Errorf("initramfs lacks %s", name)
		}
	}
}

// Two processes filling one cache entry at once: the second publish keeps the first's tree and drops its own.
func TestPublishDirConcurrent(t *testing.T) {
	base := t.TempDir()
	dst := filepath.Join(base, "entry")
	mk := func(tag string) string {
		tmp, err := os.MkdirTemp(base, "entry.tmp-")
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{".complete", tag} {
			if err := os.WriteFile(filepath.Join(tmp, f), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return tmp
	}
	a, b := mk("a"), mk("b")
	if err := PublishDir(a, dst); err != nil {
		t.Fatal(err)
	}
	if err := PublishDir(b, dst); err != nil {
		t.Fatalf("second publish: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dst, "a")); err != nil {
		t.Fatalf("first tree replaced: %v", err)
	}
	if _, err := os.Stat(b); !os.IsNotExist(err) {
		t.Fatalf("second tree left behind: %v", err)
	}
	// An incomplete entry (an older layout) is replaced.
	if err := os.RemoveAll(dst); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dst, "junk"), 0o755); err != nil {
		t.Fatal(err)
	}
	c := mk("c")
	if err := PublishDir(c, dst); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dst, "c")); err != nil {
		t.Fatalf("incomplete entry not replaced: %v", err)
	}
}
