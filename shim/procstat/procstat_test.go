package procstat

import (
	"errors"
	"io/fs"
	"os"
	"testing"
)

func TestParse(t *testing.T) {
	// The command holds spaces and ')'.
	st, err := Parse([]byte("123 (a) b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 98765 20 21\n"))
	if err != nil || st.State != 'S' || st.Start != 98765 || st.Exited() {
		t.Errorf("%+v %v", st, err)
	}
	zombie, err := Parse([]byte("4242 (cube-vmm) Z 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 3 0 8123 0 0 0"))
	if err != nil || zombie.Start != 8123 || !zombie.Exited() {
		t.Errorf("a zombie: %+v %v", zombie, err)
	}
	for _, bad := range []string{"", "1 (x", "1 (x) S 1 2", "4242 cube-vmm S 1", "1 (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 -5",
		"1 (x) SS 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 5"} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestRead(t *testing.T) {
	a, err := Read(os.Getpid())
	if err != nil || a.Start == 0 || a.Exited() {
		t.Fatalf("this process: %+v %v", a, err)
	}
	if b, _ := Read(os.Getpid()); b.Start != a.Start {
		t.Errorf("start time changed: %d then %d", a.Start, b.Start)
	}
	if _, err := Read(2147483646); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a pid that does not exist: %v, want fs.ErrNotExist", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("4242 (cube vmm) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 3 0 8123 1000 10"))
	f.Add([]byte("1 (a) Z"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = Parse(b) // must not panic, whatever /proc holds
	})
}
