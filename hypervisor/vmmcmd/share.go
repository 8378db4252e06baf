package vmmcmd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cube-runtime/cube/hypervisor/machine"
	"github.com/cube-runtime/cube/hypervisor/virtio/fs"
)

// Share is one virtio-fs shared directory ([[fs]] in the config file): the
// guest mounts it with mount -t virtiofs TAG DIR.
type Share struct {
	Tag      string `toml:"tag" json:"Tag"`            // 1–36 bytes, unique
	Path     string `toml:"path" json:"Path"`          // absolute host directory
	ReadOnly bool   `toml:"read_only" json:"ReadOnly"` // refuse every change with EROFS
}

const shareForm = "tag=TAG,path=DIR[,ro]"

// parseShare reads the -fs flag form tag=TAG,path=DIR[,ro].
func parseShare(s string) (Share, error) {
	var sh Share
	for _, p := range strings.Split(s, ",") {
		switch {
		case p == "ro":
			sh.ReadOnly = true
		case strings.HasPrefix(p, "tag="):
			sh.Tag = strings.TrimPrefix(p, "tag=")
		case strings.HasPrefix(p, "path="):
			sh.Path = strings.TrimPrefix(p, "path=")
		default:
			return sh, fmt.Errorf("-fs %q: unknown option %q (want %s)", s, p, shareForm)
		}
	}
	if sh.Tag == "" || sh.Path == "" {
		return sh, fmt.Errorf("-fs %q: tag and path are required (want %s)", s, shareForm)
	}
	return sh, nil
}

// checkShares validates the shares before anything is opened.
func checkShares(shares []Share) error {
	seen := map[string]int{}
	for i, sh := range shares {
		if sh.Tag == "" || len(sh.Tag) > fs.TagLen {
			return fmt.Errorf("fs %d: tag %q must be 1 to %d bytes", i, sh.Tag, fs.TagLen)
		}
		if j, ok := seen[sh.Tag]; ok {
			return fmt.Errorf("fs %d and %d have the same tag %q", j, i, sh.Tag)
		}
		seen[sh.Tag] = i
		if !filepath.IsAbs(sh.Path) {
			return fmt.Errorf("fs %d: path %q must be absolute", i, sh.Path)
		}
		fi, err := os.Stat(sh.Path)
		if err != nil {
			return fmt.Errorf("fs %d: %v", i, err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("fs %d: %s is not a directory", i, sh.Path)
		}
	}
	return nil
}

type shareFlags []Share

func (d *shareFlags) String() string { return fmt.Sprint(*d) }
func (d *shareFlags) Set(s string) error {
	sh, err := parseShare(s)
	if err != nil {
		return err
	}
	*d = append(*d, sh)
	return nil
}

// attachShares puts one virtio-fs device per share on the bus.
func attachShares(m *machine.Machine, shares []Share, closers *[]func() error) error {
	for i, sh := range shares {
		dev, err := fs.Open(fs.Options{Tag: sh.Tag, Dir: sh.Path, ReadOnly: sh.ReadOnly})
		if err != nil {
			return fmt.Errorf("fs %d: %w", i, err)
		}
		*closers = append(*closers, dev.Close)
		if _, err := m.AddVirtio(dev, 0x01, 0x80); err != nil {
			return fmt.Errorf("fs %d: %w", i, err)
		}
	}
	return nil
}
