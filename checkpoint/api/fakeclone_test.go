package api

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/checkpoint/clone"
	"github.com/cube-runtime/cube/checkpoint/snapshots"
	"github.com/cube-runtime/cube/checkpoint/store"
	snapapi "github.com/cube-runtime/cube/shim/snapshotapi"
)

// fakeMaker is checkpoint/clone's Maker over the fake backend: the
// containers it makes are the fake's, their guests what the snapshot saw.
type fakeMaker struct{ f *fakeBackend }

// Record implements clone.Maker.
func (m fakeMaker) Record(ctx context.Context, id string) (clone.Record, error) {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	c, err := m.f.get(id)
	if err != nil {
		return clone.Record{}, err
	}
	spec, _ := json.Marshal(&specs.Spec{Process: &specs.Process{Args: []string{"sleep", "inf"}, Env: append([]string{"PATH=/bin"}, m.f.specs[id].Env...)}})
	return clone.Record{Version: clone.RecordVersion, Container: id, Namespace: m.f.ns, Image: c.Image,
		Snapshotter: "cube", Runtime: DefaultRuntime, Spec: spec}, nil
}

// Make implements clone.Maker: f.makeErr[n] fails the nth call (from 1).
func (m fakeMaker) Make(ctx context.Context, id string, rec clone.Record, dir string, labels map[string]string) (uint32, error) {
	f := m.f
	f.mu.Lock()
	defer f.mu.Unlock()
	f.makes++
	if err := f.makeErr[f.makes]; err != nil {
		return 0, fmt.Errorf("clone %s: %w", id, err)
	}
	if f.ctrs[id] != nil {
		return 0, fmt.Errorf("clone %s: container exists: %w", id, errdefs.ErrAlreadyExists)
	}
	var spec specs.Spec
	if err := json.Unmarshal(rec.Spec, &spec); err != nil {
		return 0, err
	}
	lb := map[string]string{}
	for k, v := range labels {
		lb[k] = v
	}
	f.ctrs[id] = &Container{ID: id, Image: rec.Image, Labels: lb, Created: time.Now(), Status: "running"}
	f.specs[id] = CreateSpec{ID: id, Image: rec.Image, Env: spec.Process.Env, Labels: lb}
	f.madeFrom[id] = dir
	// The guest is the snapshot's: its processes run again.
	g := map[string]*fakeGuestProc{}
	for e, p := range f.snapGuest[snapIDOf(dir)] {
		if p.running {
			g[e] = &fakeGuestProc{pid: p.pid, running: true}
		}
	}
	f.guest[id] = g
	return uint32(os.Getpid()), nil
}

// Remove implements clone.Maker.
func (m fakeMaker) Remove(ctx context.Context, id string) error {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	if _, err := m.f.get(id); err != nil {
		return err
	}
	delete(m.f.ctrs, id)
	return nil
}

// snapIDOf is the store id of a snapshot directory.
func snapIDOf(dir string) string {
	for i := len(dir) - 1; i >= 0; i-- {
		if dir[i] == '/' {
			return dir[i+1:]
		}
	}
	return dir
}

func (f *fakeBackend) Restore(ctx context.Context, spec CreateSpec, sn store.Snapshot) (Container, error) {
	return restoreSandbox(ctx, f.st, fakeMaker{f}, f.ns, spec, sn, f)
}

func (f *fakeBackend) Fork(ctx context.Context, id string, sp []CreateSpec, allOrNothing bool) ([]ForkResult, error) {
	if _, err := f.Get(ctx, id); err != nil {
		return nil, err
	}
	log := logrus.New()
	log.SetOutput(os.Stderr)
	return forkSandbox(ctx, f.st, fakeForkShim{fakeShim{f}, id}, fakeMaker{f}, forkPlan{Source: id,
		Sandbox: snapshots.SandboxKey(f.ns, id), Specs: sp, AllOrNothing: allOrNothing}, f, log)
}

// fakeForkShim is fakeShim that records the guest's processes in the
// snapshot (as the fake's Snapshot does).
type fakeForkShim struct {
	fakeShim
	id string
}

func (s fakeForkShim) Snapshot(ctx context.Context, req *snapapi.SnapshotRequest) (*snapapi.SnapshotResponse, error) {
	resp, err := s.fakeShim.Snapshot(ctx, req)
	if err == nil {
		s.f.recordGuest(s.id, req.Id)
	}
	return resp, err
}

// recordGuest keeps what sandbox id's guest runs as snapshot snap's.
func (f *fakeBackend) recordGuest(id, snap string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	seen := map[string]fakeGuestProc{}
	for e, g := range f.guest[id] {
		seen[e] = *g
	}
	f.snapGuest[snap] = seen
}

// DropLabel implements clone.Finisher.
func (m fakeMaker) DropLabel(ctx context.Context, id, label string) error {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	c, err := m.f.get(id)
	if err != nil {
		return err
	}
	delete(c.Labels, label)
	return nil
}
