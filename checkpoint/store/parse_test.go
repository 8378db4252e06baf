package store

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

var testTime = time.Date(2026, 5, 1, 12, 0, 0, 123, time.UTC)

func testOwner() Process {
	return Process{PID: 42, Start: 1000, Boot: "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"}
}

func testEntry() *entryFile {
	return &entryFile{Version: FormatVersion, ID: "0123456789abcdef01234567", Sandbox: "sb1", Parent: "89abcdef0123456789abcdef", Kind: Incremental, Size: 4096, Created: testTime}
}

func testPending() *pendingFile {
	return &pendingFile{Version: FormatVersion, ID: "0123456789abcdef01234567", Sandbox: "sb1", Names: []string{"a", "b"}, Op: "fork-1", Owner: testOwner(), Begun: testTime}
}

func testRef() *refFile {
	return &refFile{Version: FormatVersion, Snapshot: "0123456789abcdef01234567", Holder: "sandbox sb1", Process: testOwner(), Acquired: testTime}
}

func mustEncode(t testing.TB, v any) []byte {
	b, err := encode(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseRoundTrip(t *testing.T) {
	e := testEntry()
	owner := testOwner()
	e.Op, e.Owner = "fork-1", &owner
	got, err := parseEntry(mustEncode(t, e))
	if err != nil || *got.Owner != *e.Owner || got.Created != e.Created || got.ID != e.ID || got.Kind != e.Kind {
		t.Errorf("entry: %+v, %v", got, err)
	}
	if p, err := parsePending(mustEncode(t, testPending())); err != nil || p.Owner != testOwner() || len(p.Names) != 2 {
		t.Errorf("pending: %+v, %v", p, err)
	}
	if r, err := parseRef(mustEncode(t, testRef())); err != nil || r.Holder != "sandbox sb1" {
		t.Errorf("ref: %+v, %v", r, err)
	}
	// Fields this build does not know are ignored (a later build's
	// omitempty additions).
	b := strings.Replace(string(mustEncode(t, testEntry())), `"sandbox"`, `"future": [1, 2], "sandbox"`, 1)
	if _, err := parseEntry([]byte(b)); err != nil {
		t.Errorf("unknown field: %v", err)
	}
}

func TestParseRefusals(t *testing.T) {
	entry := func(f func(e *entryFile)) []byte {
		e := testEntry()
		f(e)
		return mustEncode(t, e)
	}
	for name, c := range map[string]struct {
		b    []byte
		want string
	}{
		"empty":          {nil, "unexpected end"},
		"not json":       {[]byte("{"), "unexpected end"},
		"array":          {[]byte("[]"), "cannot unmarshal"},
		"no version":     {[]byte(`{"id":"x"}`), "no version"},
		"huge":           {[]byte(`{"version":1,"sandbox":"` + strings.Repeat("a", maxEntryFile) + `"}`), "at most 16384"},
		"bad id":         {entry(func(e *entryFile) { e.ID = "../../etc" }), `id "../../etc": not a snapshot id`},
		"upper id":       {entry(func(e *entryFile) { e.ID = strings.ToUpper(e.ID) }), "not a snapshot id"},
		"no sandbox":     {entry(func(e *entryFile) { e.Sandbox = "" }), "sandbox is empty"},
		"long sandbox":   {entry(func(e *entryFile) { e.Sandbox = strings.Repeat("s", 300) }), "at most 256"},
		"self parent":    {entry(func(e *entryFile) { e.Parent = e.ID }), "parent is the snapshot itself"},
		"bad parent":     {entry(func(e *entryFile) { e.Parent = "x" }), `parent "x"`},
		"bad kind":       {entry(func(e *entryFile) { e.Kind = "diff" }), `kind "diff"`},
		"orphan":         {entry(func(e *entryFile) { e.Parent = "" }), "incremental snapshot without a parent"},
		"negative size":  {entry(func(e *entryFile) { e.Size = -1 }), "size -1"},
		"zero time":      {entry(func(e *entryFile) { e.Created = time.Time{} }), "created"},
		"op no owner":    {entry(func(e *entryFile) { e.Op = "f" }), "both or neither"},
		"owner bad pid":  {entry(func(e *entryFile) { e.Op, e.Owner = "f", &Process{PID: -1, Start: 1, Boot: "ab"} }), "pid -1"},
		"owner bad boot": {entry(func(e *entryFile) { e.Op, e.Owner = "f", &Process{PID: 1, Start: 1, Boot: "../x"} }), "boot id"},
	} {
		_, err := parseEntry(c.b)
		if err == nil || !errors.Is(err, ErrCorrupt) || !errdefs.IsDataLoss(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrCorrupt saying %q", name, err, c.want)
		}
	}
	_, err := parseEntry([]byte(`{"version":2,"id":5}`))
	if !errors.Is(err, ErrVersion) || !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "version 2, this build reads 1") {
		t.Errorf("newer version: %v", err)
	}
	p := testPending()
	p.Names = []string{"a", "a"}
	if _, err := parsePending(mustEncode(t, p)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("pending with a name twice: %v", err)
	}
	r := testRef()
	r.Holder = "x\x00y"
	if _, err := parseRef(mustEncode(t, r)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("ref with a NUL in the holder: %v", err)
	}
}

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"a", "Z9", "warm-1.0_b", strings.Repeat("n", MaxNameLen), "0123456789abcdef0123456"} {
		if err := checkName("name", ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".x", "-x", "_x", "a/b", "a b", "é", "..", "a\x00", strings.Repeat("n", MaxNameLen+1), "0123456789abcdef01234567"} {
		err := checkName("name", bad)
		if err == nil || !strings.Contains(err.Error(), "name") || !strings.Contains(err.Error(), "only letters, digits") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// TestProcessOf: /proc/PID/stat itself is parsed by shim/procstat (its
// TestParse holds the lines this test parsed before).
func TestProcessOf(t *testing.T) {
	self, err := processOf(os.Getpid(), "b00t")
	if err != nil || self.Start == 0 {
		t.Fatalf("this process: %+v %v", self, err)
	}
	if !self.alive("b00t") {
		t.Error("this process is not alive")
	}
	for _, p := range []Process{{self.PID, self.Start + 1, "b00t"}, {self.PID, self.Start, "0ther"}, {1 << 22, 1, "b00t"}} {
		if p.alive("b00t") {
			t.Errorf("%+v alive", p)
		}
	}
}
