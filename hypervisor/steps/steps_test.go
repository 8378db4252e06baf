package steps

import (
	"regexp"
	"testing"
	"time"
)

func TestStepsString(t *testing.T) {
	s := New(time.Now().Add(-time.Millisecond))
	s.Mark("open")
	s.Mark("vm")
	got := s.String()
	if s.Total() < time.Millisecond {
		t.Errorf("Total() = %v, want at least the millisecond before the start", s.Total())
	}
	if !regexp.MustCompile(`^open=\d+\.\d\d vm=\d+\.\d\d$`).MatchString(got) {
		t.Fatalf("String() = %q", got)
	}
}

func TestStepsNil(t *testing.T) {
	var s *Steps
	s.Mark("x") // must not panic
	if s.String() != "" || s.Total() != 0 {
		t.Errorf("nil Steps String() = %q", s.String())
	}
}
