package guestimage

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
)

// GuestSpec describes a sandbox guest's initramfs.
type GuestSpec struct {
	// Init is the host path of the static program that becomes /init (the guest agent).
	Init string
	// Modules are kernel modules (by name) the guest loads; they and their dependencies are placed at
	// /lib/modules/<release>/<path as in the package>, where the agent's loader looks for them.
	Modules []string
	// Files maps extra paths inside the image to host files.
	Files map[string]string
}

// WriteGuestInitramfs writes the guest's gzip-compressed initramfs for kernel k and returns the module
// files it holds, dependencies first.
func WriteGuestInitramfs(k *Kernel, spec GuestSpec, w io.Writer) ([]string, error) {
	if spec.Init == "" {
		return nil, fmt.Errorf("guest image: no init program given")
	}
	libs, err := SharedLibs(spec.Init)
	if err != nil {
		return nil, fmt.Errorf("guest image: init %s: %w", spec.Init, err)
	}
	if len(libs) > 0 {
		return nil, fmt.Errorf("guest image: init %s is dynamically linked (needs %v); build it static with CGO_ENABLED=0", spec.Init, libs)
	}
	mods, err := k.Modules(spec.Modules...)
	if err != nil {
		return nil, fmt.Errorf("guest image: %w", err)
	}
	r := NewInitramfs()
	if err := r.File("init", spec.Init); err != nil {
		return nil, err
	}
	for _, d := range []string{"proc", "sys", "dev", "run", "tmp", "mnt"} {
		if err := r.Dir(d, 0o755); err != nil {
			return nil, err
		}
	}
	for _, m := range mods {
		if err := r.File(path.Join("lib/modules", k.Release, m), path.Join(k.ModulesDir(), m)); err != nil {
			return nil, err
		}
	}
	for in, host := range spec.Files {
		if err := r.File(in, host); err != nil {
			return nil, err
		}
	}
	if err := r.WriteTo(w, true); err != nil {
		return nil, fmt.Errorf("guest image: %w", err)
	}
	return mods, nil
}

// Guest is a built sandbox guest: the kernel and the initramfs to boot it with.
type Guest struct {
	Kernel    string
	Initramfs string
	Release   string
	Modules   []string
}

// BuildGuest writes <outDir>/vmlinuz and <outDir>/initramfs.cpio.gz for spec with the pinned kernel (fetched
// into cacheDir when missing). Files are written under temporary names and renamed, so a reader never sees
// a half-written image.
func BuildGuest(ctx context.Context, cacheDir, outDir string, spec GuestSpec) (*Guest, error) {
	k, err := FetchKernel(ctx, cacheDir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	g := &Guest{Kernel: filepath.Join(outDir, "vmlinuz"), Initramfs: filepath.Join(outDir, "initramfs.cpio.gz"), Release: k.Release}
	var buf bytes.Buffer
	if g.Modules, err = WriteGuestInitramfs(k, spec, &buf); err != nil {
		return nil, err
	}
	kernel, err := os.ReadFile(k.Vmlinuz)
	if err != nil {
		return nil, err
	}
	for path, data := range map[string][]byte{g.Initramfs: buf.Bytes(), g.Kernel: kernel} {
		if err := writeAtomic(path, data); err != nil {
			return nil, err
		}
	}
	return g, nil
}

func writeAtomic(path string, data []byte) error {
	// A unique temporary name: several builds may fill one cache at once.
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}
