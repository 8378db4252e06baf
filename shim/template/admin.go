package template

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Info is one template as List sees it.
type Info struct {
	Key string
	// Meta is template.json (zero Key when it is unreadable).
	Meta Meta
	// Bytes is the disk space its files use (allocated blocks: a memory
	// file is sparse where the guest never wrote).
	Bytes int64
	// Failed is the last failed build's error when no template exists.
	Failed string
}

// List returns the templates under root and the keys whose build failed,
// by creation time (failed ones last). A missing root is an empty list.
func List(root string) ([]Info, error) {
	ents, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list templates in %s: %w", root, err)
	}
	var out []Info
	have := map[string]bool{}
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		in := Info{Key: e.Name()}
		if b, err := os.ReadFile(filepath.Join(root, e.Name(), "template.json")); err == nil {
			_ = json.Unmarshal(b, &in.Meta)
		}
		in.Bytes = diskUsage(filepath.Join(root, e.Name()))
		have[in.Key] = true
		out = append(out, in)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Meta.Created.Before(out[j].Meta.Created) })
	for _, e := range ents {
		key, ok := strings.CutSuffix(e.Name(), ".failed")
		if !ok || have[key] {
			continue
		}
		b, _ := os.ReadFile(filepath.Join(root, e.Name()))
		out = append(out, Info{Key: key, Failed: strings.TrimSpace(string(b))})
	}
	return out, nil
}

func diskUsage(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*unix.Stat_t); ok {
				n += st.Blocks * 512
			} else {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// Remove deletes template key (and a remembered failure of it). It refuses
// while a build holds the key's lock. Sandboxes already restored from the
// template keep running (their memory mapping outlives the file); a later
// sandbox of that shape makes it again.
func Remove(root, key string) error {
	if key == "" || strings.ContainsAny(key, "/.") {
		return fmt.Errorf("template key %q: %w", key, errdefs.ErrInvalidArgument)
	}
	dir := filepath.Join(root, key)
	failed := filepath.Join(root, key+".failed")
	if !exists(dir) && !exists(failed) {
		return fmt.Errorf("template %s in %s: %w", key, root, errdefs.ErrNotFound)
	}
	lp := filepath.Join(root, key+".lock")
	f, err := os.OpenFile(lp, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("template lock: %w", err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("template %s is being built (a shim holds %s): try again when it is done: %w", key, lp, errdefs.ErrUnavailable)
		}
		return fmt.Errorf("template lock %s: %w", lp, err)
	}
	// Ordering: out of sight first (a rename), then deleted: a shim never
	// sees a half-removed template as complete.
	gone := filepath.Join(root, fmt.Sprintf(".rm-%s-%d", key, os.Getpid()))
	if exists(dir) {
		if err := os.Rename(dir, gone); err != nil {
			return fmt.Errorf("remove template %s: %w", key, err)
		}
	}
	if err := os.RemoveAll(gone); err != nil {
		return fmt.Errorf("remove template %s: %w", key, err)
	}
	if err := os.Remove(failed); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove template %s: %w", key, err)
	}
	_ = os.Remove(lp)
	return nil
}
