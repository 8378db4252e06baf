package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/checkpoint/clone"
	"github.com/cube-runtime/cube/checkpoint/snapshots"
	"github.com/cube-runtime/cube/checkpoint/store"
)

// Restore implements Restorer with checkpoint/clone's Restore (as `cube
// restore`): the container the snapshot's record describes, with the API's
// id, labels and environment, its task restored from the snapshot in place.
func (c *Containerd) Restore(ctx context.Context, spec CreateSpec, sn store.Snapshot) (Container, error) {
	inner := &clone.Containerd{Client: c.client(), Namespace: c.Namespace}
	return restoreSandbox(ctx, c.Store, inner, c.Namespace, spec, sn, c)
}

// Fork implements Forker with checkpoint/clone's Fork (as `cube fork`):
// one temporary snapshot of the sandbox, len(specs) restores of it, the
// snapshot deleted before Fork returns.
func (c *Containerd) Fork(ctx context.Context, id string, specs []CreateSpec, allOrNothing bool) ([]ForkResult, error) {
	sh, target, err := c.shimOf(ctx, id)
	if err != nil {
		return nil, err
	}
	defer sh.Close()
	inner := &clone.Containerd{Client: c.client(), Namespace: c.Namespace}
	return forkSandbox(ctx, c.Store, sh, inner, forkPlan{Source: id, Sandbox: snapshots.SandboxKey(c.Namespace, target.Container.Group),
		Specs: specs, AllOrNothing: allOrNothing}, c, c.log())
}

// sandboxGetter is what restoreSandbox and forkSandbox need of a Backend.
type sandboxGetter interface {
	Get(ctx context.Context, id string) (Container, error)
	Delete(ctx context.Context, id string) error
}

// restoreSandbox makes sandbox spec from snapshot sn through clone.Restore
// with inner making the containers.
func restoreSandbox(ctx context.Context, st *store.Store, inner clone.Maker, ns string, spec CreateSpec, sn store.Snapshot, be sandboxGetter) (Container, error) {
	m := &sandboxMaker{inner: inner, byClone: map[string]CreateSpec{spec.ID: spec}}
	res, err := clone.Restore(ctx, st, m, ns, sn.ID, spec.ID)
	if err != nil {
		if res.ID != "" {
			// Made, but the store's reference could not follow its VMM: a
			// sandbox that does not hold its snapshot is not kept.
			if derr := be.Delete(context.WithoutCancel(ctx), spec.ID); derr != nil {
				err = errors.Join(err, fmt.Errorf("and deleting sandbox %s failed: %w", spec.ID, derr))
			}
		}
		return Container{}, err
	}
	return be.Get(ctx, spec.ID)
}

// forkPlan is what forkSandbox makes.
type forkPlan struct {
	Source, Sandbox string // the container and its store sandbox key
	Specs           []CreateSpec
	AllOrNothing    bool
}

// forkSandbox forks p.Source into p.Specs through clone.Fork (the temporary
// snapshot taken through sh, deleted before it returns): one result per
// spec, in order. An error only when no clone was tried.
func forkSandbox(ctx context.Context, st *store.Store, sh snapshots.Shim, inner clone.Maker, p forkPlan, be sandboxGetter, log *logrus.Logger) ([]ForkResult, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	prefix := "apifork-" + hex.EncodeToString(b[:])
	byClone := make(map[string]CreateSpec, len(p.Specs))
	for i, s := range p.Specs {
		byClone[fmt.Sprintf("%s-%d", prefix, i+1)] = s
	}
	f, err := clone.Fork(ctx, st, sh, &sandboxMaker{inner: inner, byClone: byClone}, clone.ForkOptions{Container: p.Source,
		Sandbox: p.Sandbox, N: len(p.Specs), Prefix: prefix, AllOrNothing: p.AllOrNothing})
	for _, w := range f.Warnings {
		log.WithFields(logrus.Fields{"fork": f.Op, "sandbox": p.Source}).Warn(w)
	}
	if len(f.Clones) == 0 && err != nil {
		return nil, takeError(err)
	}
	out := make([]ForkResult, len(p.Specs))
	for i, s := range p.Specs {
		switch {
		case i >= len(f.Clones):
			out[i].Err = fmt.Errorf("sandbox %s was not made: another clone failed first (all or nothing): %w", s.ID, errdefs.ErrConflict)
		case f.Clones[i].Err != nil:
			out[i].Err = f.Clones[i].Err
		case f.Clones[i].Removed:
			out[i].Err = fmt.Errorf("sandbox %s was made, then deleted: another clone failed (all or nothing): %w", s.ID, errdefs.ErrConflict)
		default:
			ct, err := be.Get(ctx, s.ID)
			out[i] = ForkResult{Container: ct, Err: err}
		}
	}
	return out, nil
}

// sandboxMaker makes clone's containers as sandboxes: byClone maps the id
// clone asks for to the sandbox to make (the API's id, its labels beside
// clone's, its environment added to the recorded spec's).
type sandboxMaker struct {
	inner   clone.Maker
	byClone map[string]CreateSpec
}

func (m *sandboxMaker) spec(id string) (CreateSpec, error) {
	s, ok := m.byClone[id]
	if !ok {
		return CreateSpec{}, fmt.Errorf("clone %s: no sandbox is planned for it: %w", id, errdefs.ErrInternal)
	}
	return s, nil
}

// Record implements clone.Maker.
func (m *sandboxMaker) Record(ctx context.Context, id string) (clone.Record, error) {
	return m.inner.Record(ctx, id)
}

// Make implements clone.Maker.
func (m *sandboxMaker) Make(ctx context.Context, id string, rec clone.Record, dir string, labels map[string]string) (uint32, error) {
	s, err := m.spec(id)
	if err != nil {
		return 0, err
	}
	all := make(map[string]string, len(s.Labels)+len(labels))
	for k, v := range s.Labels {
		all[k] = v
	}
	for k, v := range labels {
		all[k] = v
	}
	if len(s.Env) > 0 {
		if rec.Spec, err = withEnv(rec.Spec, s.Env); err != nil {
			return 0, fmt.Errorf("sandbox %s: %w", s.ID, err)
		}
	}
	return m.inner.Make(ctx, s.ID, rec, dir, all)
}

// Remove implements clone.Maker.
func (m *sandboxMaker) Remove(ctx context.Context, id string) error {
	s, err := m.spec(id)
	if err != nil {
		return err
	}
	return m.inner.Remove(ctx, s.ID)
}

// withEnv adds env (KEY=VALUE, replacing the same keys) to the process of
// the recorded spec: the commands run later in the sandbox inherit it (the
// restored processes keep the environment they had).
func withEnv(raw json.RawMessage, env []string) (json.RawMessage, error) {
	var spec oci.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return nil, fmt.Errorf("the snapshot's container record: spec: %v: %w", err, errdefs.ErrDataLoss)
	}
	if spec.Process == nil {
		return nil, fmt.Errorf("the snapshot's container record has no process: %w", errdefs.ErrDataLoss)
	}
	spec.Process.Env = mergeEnv(spec.Process.Env, env)
	return json.Marshal(&spec)
}

// mergeEnv is base with add's variables, add's winning.
func mergeEnv(base, add []string) []string {
	key := func(kv string) string {
		for i := 0; i < len(kv); i++ {
			if kv[i] == '=' {
				return kv[:i]
			}
		}
		return kv
	}
	set := map[string]bool{}
	for _, kv := range add {
		set[key(kv)] = true
	}
	out := make([]string, 0, len(base)+len(add))
	for _, kv := range base {
		if !set[key(kv)] {
			out = append(out, kv)
		}
	}
	return append(out, add...)
}

var (
	_ Restorer = (*Containerd)(nil)
	_ Forker   = (*Containerd)(nil)
)

// DropLabel implements clone.Finisher (a fork's kept clones lose their
// pending mark).
func (m *sandboxMaker) DropLabel(ctx context.Context, id, label string) error {
	s, err := m.spec(id)
	if err != nil {
		return err
	}
	f, ok := m.inner.(clone.Finisher)
	if !ok {
		return fmt.Errorf("sandbox %s: cannot drop label %s: %w", s.ID, label, errdefs.ErrNotImplemented)
	}
	return f.DropLabel(ctx, s.ID, label)
}
