package machine

import (
	"regexp"
	"testing"
	"time"
)

func TestStepsString(t *testing.T) {
	s := NewSteps(time.Now())
	s.Mark("open")
	s.Mark("vm")
	got := s.String()
	if !regexp.MustCompile(`^open=\d+\.\d\d vm=\d+\.\d\d$`).MatchString(got) {
		t.Fatalf("String() = %q", got)
	}
}

func TestStepsNil(t *testing.T) {
	var s *Steps
	s.Mark("x") // must not panic
	if s.String() != "" {
		t.Errorf("nil Steps String() = %q", s.String())
	}
}
