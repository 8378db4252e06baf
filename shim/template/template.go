// Package template is the shim's cache of automatic template snapshots: a
// VM of a sandbox's shape, booted once until its guest agent answers and
// snapshotted, that every later sandbox of the same shape is restored from
// instead of cold-booting (docs/shim.md, "Templates").
//
// A template is keyed by everything the snapshot depends on (Key): the
// bytes of the kernel, the initrd (with the guest agent) and the cube-vmm
// binary, the kernel command line, memory, vCPUs, drive slots, NICs and
// this package's layout version. A new initrd is a new key, so a new template;
// an old one stays until `cube templates rm` removes it. Layout under Root:
//
//	<key>/vm/            the VM snapshot (cube-vmm restore's directory)
//	<key>/template.json  Meta: what the key stands for, when it was made
//	<key>.lock           flock held while a shim builds <key> (or rm removes it)
//	<key>.failed         the last build's error; no retry for FailTTL
//	.build-<key>-<pid>/  a build in progress, renamed to <key> when complete
//	.digests/            file digests, keyed by path, reused while the file's stat is unchanged
package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// Version is the layout and build recipe version; part of every key.
// 2: the key has the number of NICs (a template per NIC count).
// 3: the VM is snapshotted with a spare container helper parked in the
// guest (the agent's PrepareSpare).
const Version = "cube-template-3"

// FailTTL is how long a failed build is remembered: sandboxes started
// meanwhile cold-boot at once instead of each retrying it.
const FailTTL = 10 * time.Minute

// Shape is what a template VM is made of: the sandbox's machine.
type Shape struct {
	// VMM is the cube-vmm binary (a path or a name in PATH).
	VMM       string
	Kernel    string
	Initrd    string // "" for none
	Cmdline   string
	MemoryMiB uint32
	VCPUs     uint32
	DiskSlots int
	// NICs is how many virtio-net devices (with no backend) the template
	// VM has: 0 for a sandbox without a network of its own, else its
	// network's NIC count; a restore gives each the sandbox's tap.
	NICs int
}

// Meta is <key>/template.json: what a template is for.
type Meta struct {
	Key     string    `json:"key"`
	Version string    `json:"version"`
	Created time.Time `json:"created"`
	// Shape is the shape it was made for (paths as the shim config named them).
	Shape Shape `json:"shape"`
	// Digests are the sha256 of the kernel, initrd and vmm files, by role.
	Digests map[string]string `json:"digests"`
	// BuildSeconds is how long the boot and snapshot took.
	BuildSeconds float64 `json:"build_seconds"`
}

// BuildFunc makes a template: it boots a VM of shape with stub drives in
// every slot in work (a fresh directory for its sockets and console), waits
// for the agent and snapshots the VM into snapDir (absolute, not existing).
// It stops the VM before it returns.
type BuildFunc func(ctx context.Context, shape Shape, work, snapDir string) error

// Cache finds or makes templates under Root.
type Cache struct {
	Root string
	// Wait bounds how long Get waits for another process's build.
	Wait time.Duration
	// Build makes a template (required for Get).
	Build BuildFunc
	// BuildTimeout bounds one build (default 5 minutes).
	BuildTimeout time.Duration
	Log          *logrus.Entry
}

// Key returns the template key of shape and what it was computed from.
func (c *Cache) Key(shape Shape) (string, Meta, error) {
	m := Meta{Version: Version, Shape: shape, Digests: map[string]string{}}
	vmm := shape.VMM
	if p, err := lookPath(vmm); err == nil {
		vmm = p
	} else {
		return "", m, fmt.Errorf("template key: find vmm binary %q: %w", shape.VMM, err)
	}
	files := []struct{ role, path string }{{"vmm", vmm}, {"kernel", shape.Kernel}, {"initrd", shape.Initrd}}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", Version)
	cacheDir := filepath.Join(c.Root, ".digests")
	var fresh []*digestEntry
	for _, f := range files {
		d := ""
		if f.path != "" {
			var (
				e   *digestEntry
				err error
			)
			if d, e, err = fileDigest(cacheDir, f.path); err != nil {
				return "", m, fmt.Errorf("template key: %s: %w", f.role, err)
			}
			if e != nil {
				fresh = append(fresh, e)
			}
			m.Digests[f.role] = d
		}
		fmt.Fprintf(h, "%s=%s\n", f.role, d)
	}
	saveDigests(cacheDir, fresh)
	fmt.Fprintf(h, "cmdline=%q\nmemory_mib=%d\nvcpus=%d\ndisk_slots=%d\nnics=%d\n", shape.Cmdline, shape.MemoryMiB, shape.VCPUs, shape.DiskSlots, shape.NICs)
	m.Key = hex.EncodeToString(h.Sum(nil)[:16])
	return m.Key, m, nil
}

// Dir is the snapshot directory of key (what cube-vmm restore reads).
func (c *Cache) Dir(key string) string { return filepath.Join(c.Root, key, "vm") }

// Get returns the template snapshot for shape, making it first if there is
// none: one process builds (flock on <key>.lock), the others wait up to
// Wait for it. An error says why there is no template (the caller
// cold-boots): the build failed now or within FailTTL, another build took
// longer than Wait, or ctx ended.
func (c *Cache) Get(ctx context.Context, shape Shape) (string, error) {
	key, meta, err := c.Key(shape)
	if err != nil {
		return "", err
	}
	dir := c.Dir(key)
	if exists(dir) {
		return dir, nil
	}
	if err := c.recentFailure(key); err != nil {
		return "", err
	}
	if err := os.MkdirAll(c.Root, 0o700); err != nil {
		return "", fmt.Errorf("template dir: %w", err)
	}
	unlock, waited, err := c.lock(ctx, key)
	if err != nil {
		return "", err
	}
	defer unlock()
	// Ordering: checked again under the lock: the build we waited for, or
	// one that finished between the first check and the lock, is done.
	if exists(dir) {
		c.log().WithFields(logrus.Fields{"template": key, "waited": waited}).Info("template made by another shim")
		return dir, nil
	}
	if err := c.recentFailure(key); err != nil {
		return "", err
	}
	start := time.Now()
	if err := c.build(ctx, key, meta); err != nil {
		msg := fmt.Sprintf("%s: %v", time.Now().UTC().Format(time.RFC3339), err)
		if werr := os.WriteFile(c.failedPath(key), []byte(msg+"\n"), 0o600); werr != nil {
			c.log().WithError(werr).Warn("cannot record the failed template build")
		}
		return "", fmt.Errorf("make template %s: %w", key, err)
	}
	c.log().WithFields(logrus.Fields{"template": key, "took": time.Since(start).Round(time.Millisecond), "dir": dir}).Info("template made")
	return dir, nil
}

func (c *Cache) log() *logrus.Entry {
	if c.Log == nil {
		return logrus.NewEntry(logrus.StandardLogger())
	}
	return c.Log
}

func (c *Cache) failedPath(key string) string { return filepath.Join(c.Root, key+".failed") }
func (c *Cache) lockPath(key string) string   { return filepath.Join(c.Root, key+".lock") }

// recentFailure is the error of a build of key that failed within FailTTL.
func (c *Cache) recentFailure(key string) error {
	p := c.failedPath(key)
	st, err := os.Stat(p)
	if err != nil {
		return nil
	}
	if age := time.Since(st.ModTime()); age < FailTTL {
		b, _ := os.ReadFile(p)
		return fmt.Errorf("template %s failed to build %v ago (%s); not retried before %v (remove %s to retry now): %w",
			key, age.Round(time.Second), strings.TrimSpace(string(b)), FailTTL, p, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// lock takes <key>.lock, waiting up to c.Wait for another holder.
func (c *Cache) lock(ctx context.Context, key string) (func(), time.Duration, error) {
	f, err := os.OpenFile(c.lockPath(key), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, 0, fmt.Errorf("template lock: %w", err)
	}
	start := time.Now()
	deadline := start.Add(c.Wait)
	// Backing off to 250 ms: many shims waiting out one build at a short
	// fixed interval take the CPU the build needs.
	for delay := 10 * time.Millisecond; ; delay = min(2*delay, 250*time.Millisecond) {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, time.Since(start), nil // closing releases the flock
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, 0, fmt.Errorf("template lock %s: %w", f.Name(), err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, 0, fmt.Errorf("template %s is being made by another process and was not ready within template_wait %v: %w",
				key, c.Wait, errdefs.ErrUnavailable)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, 0, fmt.Errorf("wait for template %s: %w", key, ctx.Err())
		case <-time.After(delay):
		}
	}
}

// build makes key in a private directory and renames it into place: a
// template directory is complete or absent.
func (c *Cache) build(ctx context.Context, key string, meta Meta) error {
	if c.Build == nil {
		return errors.New("no template builder")
	}
	to := c.BuildTimeout
	if to <= 0 {
		to = 5 * time.Minute
	}
	// The build serves every sandbox of this shape, not only the request
	// that started it: not cut short by that request's cancellation.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), to)
	defer cancel()
	tmp := filepath.Join(c.Root, fmt.Sprintf(".build-%s-%d", key, os.Getpid()))
	_ = os.RemoveAll(tmp) // a crashed build of an earlier process with our pid
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	work := filepath.Join(c.Root, fmt.Sprintf(".vm-%d", os.Getpid())) // short: it holds Unix sockets
	_ = os.RemoveAll(work)
	defer os.RemoveAll(work)
	start := time.Now()
	if err := c.Build(ctx, meta.Shape, work, filepath.Join(tmp, "vm")); err != nil {
		return err
	}
	meta.Created = time.Now().UTC()
	meta.BuildSeconds = time.Since(start).Seconds()
	b, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, "template.json"), b, 0o600); err != nil {
		return err
	}
	// Ordering: the directory is complete before the rename publishes it.
	// A leftover <key> without its vm/ (an interrupted rm) is replaced.
	_ = os.RemoveAll(filepath.Join(c.Root, key))
	if err := os.Rename(tmp, filepath.Join(c.Root, key)); err != nil {
		return fmt.Errorf("publish template: %w", err)
	}
	_ = os.Remove(c.failedPath(key))
	return nil
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }
