package store_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/checkpoint/store"
	"github.com/cube-runtime/cube/checkpoint/store/storetest"
)

// takeE is storetest.Take for goroutines: the error instead of t.Fatal.
func takeE(s *store.Store, opts store.BeginOptions) (store.Snapshot, error) {
	p, err := s.Begin(ctx, opts)
	if err != nil {
		return store.Snapshot{}, err
	}
	defer p.Abort(ctx)
	if err := storetest.Write(p.Dir(), ""); err != nil {
		return store.Snapshot{}, err
	}
	return p.Commit(ctx)
}

// Several creators at once, through two Stores on one root (as two
// processes would have), with readers and deleters beside them.
func TestConcurrentCreators(t *testing.T) {
	root := t.TempDir()
	s1, _ := open(t, root)
	s2, _ := open(t, root)
	const workers, each = 6, 3
	var wg sync.WaitGroup
	errs := make(chan error, workers*each*2)
	made := make(chan string, workers*each)
	for w := range workers {
		s := s1
		if w%2 == 1 {
			s = s2
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				snap, err := takeE(s, store.BeginOptions{Sandbox: fmt.Sprintf("sb%d", w), Names: []string{fmt.Sprintf("w%d-%d", w, i)}})
				if err != nil {
					errs <- err
					continue
				}
				made <- snap.ID
				if _, _, err := s.List(ctx, store.ListOptions{Limit: 2}); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	close(made)
	for err := range errs {
		t.Error(err)
	}
	seen := map[string]bool{}
	for id := range made {
		if seen[id] {
			t.Errorf("id %s twice", id)
		}
		seen[id] = true
	}
	for _, s := range []*store.Store{s1, s2} {
		l, _, err := s.List(ctx, store.ListOptions{})
		if err != nil || len(l) != workers*each {
			t.Fatalf("List: %d snapshots, %v; want %d", len(l), err, workers*each)
		}
		for _, snap := range l {
			if !seen[snap.ID] || len(snap.Names) != 1 {
				t.Errorf("listed %s %q", snap.ID, snap.Names)
			}
		}
	}
}

// One name, many Begins at once on two Stores: exactly one gets it.
func TestConcurrentNames(t *testing.T) {
	root := t.TempDir()
	s1, _ := open(t, root)
	s2, _ := open(t, root)
	const n = 8
	var wg sync.WaitGroup
	results := make(chan error, n)
	for i := range n {
		s := s1
		if i%2 == 1 {
			s = s2
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := takeE(s, store.BeginOptions{Sandbox: "sb1", Names: []string{"golden"}})
			results <- err
		}()
	}
	wg.Wait()
	close(results)
	won := 0
	for err := range results {
		switch {
		case err == nil:
			won++
		case !errdefs.IsAlreadyExists(err):
			t.Errorf("unexpected error: %v", err)
		}
	}
	if won != 1 {
		t.Errorf("%d Begins got the name, want 1", won)
	}
}

// What one Store does, another on the same root sees at once.
func TestTwoStoresOneRoot(t *testing.T) {
	root := t.TempDir()
	s1, _ := open(t, root)
	s2, _ := open(t, root)
	a := take(t, s1, "sb1", "a")
	if got, err := s2.Get(ctx, "a"); err != nil || got.ID != a.ID {
		t.Fatalf("s2 Get: %+v %v", got, err)
	}
	if err := s2.Acquire(ctx, "a", store.Holder{Name: "vm"}); err != nil {
		t.Fatal(err)
	}
	wantErr(t, s1.Delete(ctx, a.ID), errdefs.IsFailedPrecondition, `"vm"`)
	wantErr(t, s2.Name(ctx, take(t, s2, "sb1").ID, "a"), errdefs.IsAlreadyExists, `"a"`)
	s1.Release(ctx, a.ID, "vm")
	if err := s1.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Get(ctx, a.ID); !errdefs.IsNotFound(err) {
		t.Errorf("s2 still sees a deleted snapshot: %v", err)
	}
}
