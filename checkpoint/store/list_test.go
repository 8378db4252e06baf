package store_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/checkpoint/store"
)

func ids(l []store.Snapshot) []string {
	var out []string
	for _, s := range l {
		out = append(out, s.ID)
	}
	return out
}

func TestListPages(t *testing.T) {
	s, _ := open(t, t.TempDir())
	var want, sb2 []string
	for i := range 7 {
		sandbox := "sb1"
		if i%3 == 0 {
			sandbox = "sb2"
		}
		snap := take(t, s, sandbox)
		want = append(want, snap.ID)
		if sandbox == "sb2" {
			sb2 = append(sb2, snap.ID)
		}
	}
	all, next, err := s.List(ctx, store.ListOptions{})
	if err != nil || next != "" || !reflect.DeepEqual(ids(all), want) {
		t.Fatalf("List: %q %q %v, want %q (creation order)", ids(all), next, err, want)
	}
	var paged []string
	var sizes []int
	tok := ""
	for {
		page, next, err := s.List(ctx, store.ListOptions{Limit: 3, Token: tok})
		if err != nil {
			t.Fatal(err)
		}
		paged = append(paged, ids(page)...)
		sizes = append(sizes, len(page))
		if next == "" {
			break
		}
		tok = next
	}
	if !reflect.DeepEqual(paged, want) || !reflect.DeepEqual(sizes, []int{3, 3, 1}) {
		t.Errorf("pages %v: %q, want %q", sizes, paged, want)
	}

	// A deletion between pages does not shift the next page; a snapshot
	// committed meanwhile comes last.
	page1, tok, _ := s.List(ctx, store.ListOptions{Limit: 3})
	if err := s.Delete(ctx, want[3]); err != nil {
		t.Fatal(err)
	}
	late := take(t, s, "sb1")
	page2, _, _ := s.List(ctx, store.ListOptions{Limit: 10, Token: tok})
	if got := append(ids(page1), ids(page2)...); !reflect.DeepEqual(got, append(append(want[:3:3], want[4:]...), late.ID)) {
		t.Errorf("pages around a deletion: %q", got)
	}

	bySandbox, _, _ := s.List(ctx, store.ListOptions{Sandbox: "sb2"})
	if got := ids(bySandbox); !reflect.DeepEqual(got, []string{sb2[0], sb2[2]}) { // sb2[1] was want[3]
		t.Errorf("sandbox sb2: %q, want %q", got, []string{sb2[0], sb2[2]})
	}
	s.Name(ctx, late.ID, "late")
	byName, _, _ := s.List(ctx, store.ListOptions{Name: "late"})
	if len(byName) != 1 || byName[0].ID != late.ID || byName[0].Names[0] != "late" {
		t.Errorf("name late: %+v", byName)
	}
	_, _, err = s.List(ctx, store.ListOptions{Token: "garbage"})
	wantErr(t, err, errdefs.IsInvalidArgument, "token", "not one List returned")
	_, _, err = s.List(ctx, store.ListOptions{Limit: -1})
	wantErr(t, err, errdefs.IsInvalidArgument, "limit -1")
}

func TestCorruptMetadata(t *testing.T) {
	root := t.TempDir()
	s, hook := open(t, root)
	good := take(t, s, "sb1")
	for name, c := range map[string]struct {
		content string
		class   func(error) bool
		says    string
	}{
		"garbage":   {"\x00\xff{", errdefs.IsDataLoss, "invalid character"},
		"huge":      {`{"version":1,"x":"` + strings.Repeat("a", 20<<10) + `"}`, errdefs.IsDataLoss, "at most 16384"},
		"newer":     {`{"version":7}`, errdefs.IsFailedPrecondition, "version 7, this build reads 1"},
		"other id":  {`{"version":1,"id":"0123456789abcdef01234567","sandbox":"s","kind":"full","created":"2026-01-01T00:00:00Z"}`, errdefs.IsDataLoss, "id 0123456789abcdef01234567 in the directory of"},
		"bad kind":  {`{"version":1,"id":"ID","sandbox":"s","kind":"half","created":"2026-01-01T00:00:00Z"}`, errdefs.IsDataLoss, `kind "half"`},
		"no parent": {`{"version":1,"id":"ID","sandbox":"s","kind":"incremental","created":"2026-01-01T00:00:00Z"}`, errdefs.IsDataLoss, "without a parent"},
	} {
		t.Run(name, func(t *testing.T) {
			snap := take(t, s, "sb1", "n")
			meta := filepath.Join(snap.Dir, store.MetaName)
			if err := os.WriteFile(meta, []byte(strings.ReplaceAll(c.content, "ID", snap.ID)), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, ref := range []string{snap.ID, "n"} {
				_, err := s.Get(ctx, ref)
				wantErr(t, err, c.class, "snapshot "+snap.ID, meta, c.says)
			}
			l, _, err := s.List(ctx, store.ListOptions{})
			if err != nil || len(l) != 1 || l[0].ID != good.ID {
				t.Errorf("List with a corrupt entry: %q %v", ids(l), err)
			}
			if !logged(hook, "snapshot left out", snap.ID) {
				t.Error("the left-out snapshot is not logged")
			}
			// Reopening keeps it (data is never collected on a guess),
			// Delete removes it.
			if _, err := s.Collect(ctx); err != nil || !exists(meta) {
				t.Fatalf("Collect: %v, kept: %v", err, exists(meta))
			}
			if err := s.Delete(ctx, "n"); err != nil {
				t.Fatal(err)
			}
			if exists(snap.Dir) {
				t.Error("Delete left the corrupt snapshot")
			}
		})
	}
	// A corrupt child still protects its parent when its VM manifest maps
	// the parent's memory.
	child := takeOver(t, s, good)
	os.WriteFile(filepath.Join(child.Dir, store.MetaName), []byte("{}"), 0o600)
	wantErr(t, s.Delete(ctx, good.ID), errdefs.IsFailedPrecondition, child.ID+" (metadata unreadable)")
	// A corrupt pending record is collected (as its Begin's process is
	// unknown, it counts as gone).
	bad := filepath.Join(root, "pending", "0123456789abcdef01234567.json")
	os.WriteFile(bad, []byte(`{"version":1`), 0o600)
	if _, err := s.Collect(ctx); err != nil || exists(bad) {
		t.Errorf("corrupt pending record: %v, kept: %v", err, exists(bad))
	}
	if !errors.Is(store.ErrCorrupt, errdefs.ErrDataLoss) {
		t.Error("ErrCorrupt is not DataLoss")
	}
}
