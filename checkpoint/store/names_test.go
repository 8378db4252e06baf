package store_test

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/checkpoint/store"
)

func TestNames(t *testing.T) {
	s, _ := open(t, t.TempDir())
	a := take(t, s, "sb1", "a")
	b := take(t, s, "sb1")

	wantErr(t, s.Name(ctx, b.ID, "a"), errdefs.IsAlreadyExists, `name "a" is taken by snapshot `+a.ID, "Unname")
	_, err := s.Begin(ctx, store.BeginOptions{Sandbox: "sb1", Names: []string{"b", "a"}})
	wantErr(t, err, errdefs.IsAlreadyExists, `name "a" is taken`)
	if _, err := s.Get(ctx, "b"); !errdefs.IsNotFound(err) {
		t.Errorf("a refused Begin left name b: %v", err)
	}
	// A Begin reserves its names until it commits or aborts.
	p, err := s.Begin(ctx, store.BeginOptions{Sandbox: "sb1", Names: []string{"next"}})
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, s.Name(ctx, b.ID, "next"), errdefs.IsAlreadyExists, `name "next" is reserved by snapshot `+p.ID(), "being written")
	wantErr(t, s.Unname(ctx, "next"), errdefs.IsFailedPrecondition, "reserved by snapshot "+p.ID())
	p.Abort(ctx)

	for _, n := range []string{"next", "b.2", "B_3"} {
		if err := s.Name(ctx, b.ID, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Name(ctx, "next", "next"); err != nil { // again: no-op
		t.Fatal(err)
	}
	got, _ := s.Get(ctx, "b.2")
	if got.ID != b.ID || !reflect.DeepEqual(got.Names, []string{"B_3", "b.2", "next"}) {
		t.Fatalf("Get(b.2): %s %q", got.ID, got.Names)
	}
	if err := s.Unname(ctx, "next"); err != nil {
		t.Fatal(err)
	}
	wantErr(t, s.Unname(ctx, "next"), errdefs.IsNotFound, `"next"`)
	wantErr(t, func() error { _, err := s.Get(ctx, "next"); return err }(), errdefs.IsNotFound, `"next"`, "no snapshot has this id or name")

	for _, bad := range []string{"", "a b", "../x", ".hidden", a.ID, "x/y"} {
		wantErr(t, s.Name(ctx, b.ID, bad), errdefs.IsInvalidArgument, "name", "only letters, digits, '.', '_' and '-'")
	}
	wantErr(t, s.Name(ctx, "nosuch", "n"), errdefs.IsNotFound, `"nosuch"`)
}

func TestMaxNames(t *testing.T) {
	s, _ := open(t, t.TempDir())
	var names []string
	for i := range store.MaxNames {
		names = append(names, fmt.Sprintf("n%d", i))
	}
	snap := take(t, s, "sb1", names...)
	wantErr(t, s.Name(ctx, snap.ID, "one-more"), errdefs.IsFailedPrecondition, "at most 32")
	_, err := s.Begin(ctx, store.BeginOptions{Sandbox: "sb1", Names: append(names, "x")})
	wantErr(t, err, errdefs.IsInvalidArgument, "33 names, at most 32")
}
