// Package storetest helps tests of the snapshot store and of its users: it
// writes small synthetic VM snapshots in hypervisor/snapshot's format, as
// cube-vmm would, without KVM or root, and takes whole snapshots into a store.
package storetest

import (
	"context"
	"testing"

	"github.com/cube-runtime/cube/checkpoint/store"
	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// MemoryMiB is the guest memory size of the synthetic VM snapshots.
const MemoryMiB = 1

// WriteVM writes a synthetic VM snapshot at dir (which must not exist), as
// cube-vmm's snapshot op does: under a temporary name beside dir, then
// renamed. With parent == "" it is a full snapshot; otherwise an
// incremental one over the VM snapshot directory parent, which must be
// beside dir. Its memory holds one non-zero page, so it has a size on disk.
func WriteVM(t testing.TB, dir, parent string) {
	t.Helper()
	if err := Write(dir, parent); err != nil {
		t.Fatalf("storetest: write VM snapshot %s: %v", dir, err)
	}
}

// Write is WriteVM returning its error (for goroutines and helper processes).
func Write(dir, parent string) error {
	const size = MemoryMiB << 20
	var layers []snapshot.MemoryLayer
	if parent != "" {
		p, err := snapshot.Open(parent)
		if err != nil {
			return err
		}
		if layers, err = p.ChildLayers(); err != nil {
			return err
		}
	}
	w, err := snapshot.Create(dir, 0)
	if err != nil {
		return err
	}
	defer w.Abort()
	mem, err := w.CreateFile(snapshot.MemoryName)
	if err != nil {
		return err
	}
	defer mem.Close()
	page := make([]byte, snapshot.PageSize)
	for i := range page {
		page[i] = byte(i) | 1
	}
	if _, err := mem.WriteAt(page, 0); err != nil {
		return err
	}
	if err := mem.Truncate(size); err != nil {
		return err
	}
	own := snapshot.MemoryLayer{File: snapshot.MemoryName, Size: size}
	if parent != "" {
		dirty := make([]uint64, snapshot.BitmapBytes(size)/8)
		dirty[0] = 1
		bf, err := w.CreateFile(snapshot.BitmapName)
		if err != nil {
			return err
		}
		_, err = bf.Write(snapshot.EncodeBitmap(dirty))
		bf.Close()
		if err != nil {
			return err
		}
		own.Bitmap = snapshot.BitmapName
	}
	m := &snapshot.Manifest{
		Shape:      snapshot.Shape{VCPUs: 1, MemoryMiB: MemoryMiB},
		Components: snapshot.Components{KernelSHA256: "storetest", VMMVersion: snapshot.VMMVersion()},
		Memory:     append(layers, own),
	}
	return w.Commit(m, []byte(`{"storetest":true}`))
}

// Take takes a snapshot into s as the shim would: Begin, the VM snapshot
// written into the Pending's Dir (incremental over opts.Parent's VM snapshot
// when incremental is set), Commit.
func Take(t testing.TB, s *store.Store, opts store.BeginOptions, incremental bool) store.Snapshot {
	t.Helper()
	ctx := context.Background()
	var parentDir string
	if incremental {
		p, err := s.Get(ctx, opts.Parent)
		if err != nil {
			t.Fatalf("storetest: parent: %v", err)
		}
		parentDir = p.Dir
	}
	p, err := s.Begin(ctx, opts)
	if err != nil {
		t.Fatalf("storetest: begin: %v", err)
	}
	defer p.Abort(ctx)
	WriteVM(t, p.Dir(), parentDir)
	snap, err := p.Commit(ctx)
	if err != nil {
		t.Fatalf("storetest: commit: %v", err)
	}
	return snap
}
