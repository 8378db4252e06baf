package sandboxtest

import (
	"context"
	"fmt"
	"strings"

	"github.com/cube-runtime/cube/shim/sandbox"
)

// SyncTree records the tree (Tree returns it) and counts the call; an error
// in TreeErr is its answer instead.
func (a *Agent) SyncTree(ctx context.Context, dir string, t sandbox.Tree) (sandbox.TreeResult, error) {
	if err := a.enter("SyncTree"); err != nil {
		return sandbox.TreeResult{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.TreeErr != nil {
		return sandbox.TreeResult{}, a.TreeErr
	}
	if !strings.HasPrefix(dir, "/run/cube/volumes/") {
		return sandbox.TreeResult{}, fmt.Errorf("sync tree %q: not under /run/cube/volumes", dir)
	}
	if a.trees == nil {
		a.trees = map[string]sandbox.Tree{}
	}
	c := t
	c.Entries = append([]sandbox.TreeEntry(nil), t.Entries...)
	a.trees[dir] = c
	return sandbox.TreeResult{Written: uint32(len(t.Entries))}, nil
}

// SetTreeErr sets SyncTree's answer (nil: success).
func (a *Agent) SetTreeErr(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.TreeErr = err
}

// Tree returns the last tree SyncTree wrote at dir.
func (a *Agent) Tree(dir string) (sandbox.Tree, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.trees[dir]
	return t, ok
}

// PrepareVolume records the request (Volumes returns them).
func (a *Agent) PrepareVolume(ctx context.Context, req sandbox.VolumeRequest) error {
	if err := a.enter("PrepareVolume"); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.volumes = append(a.volumes, req)
	return nil
}

// Volumes returns every PrepareVolume request, in order.
func (a *Agent) Volumes() []sandbox.VolumeRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]sandbox.VolumeRequest(nil), a.volumes...)
}

// ReadFile returns (up to max bytes of) what WriteFile wrote at path.
func (a *Agent) ReadFile(ctx context.Context, path string, max int) ([]byte, error) {
	if err := a.enter("ReadFile"); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	f, ok := a.files[path]
	if !ok {
		return nil, fmt.Errorf("read %s: no such file", path)
	}
	return append([]byte(nil), f.data[:min(len(f.data), max)]...), nil
}
