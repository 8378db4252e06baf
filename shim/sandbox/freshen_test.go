package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// freshenAgent answers SetTime only once ReseedRandom has been called (and
// the other way round): freshenRestoredGuest must have both in flight at
// once, or it waits out the deadline.
type freshenAgent struct {
	AgentClient
	timeIn, rngIn    chan struct{}
	timeErr, rngErr  error
	gotTime          time.Time
	gotEntropyLength int
}

func (a *freshenAgent) SetTime(ctx context.Context, t time.Time) error {
	close(a.timeIn)
	a.gotTime = t
	select {
	case <-a.rngIn:
		return a.timeErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (a *freshenAgent) ReseedRandom(ctx context.Context, entropy []byte) error {
	close(a.rngIn)
	a.gotEntropyLength = len(entropy)
	select {
	case <-a.timeIn:
		return a.rngErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

func TestFreshenIssuesBothCallsTogether(t *testing.T) {
	newAgent := func() *freshenAgent { return &freshenAgent{timeIn: make(chan struct{}), rngIn: make(chan struct{})} }
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a := newAgent()
	before := time.Now()
	if err := freshenRestoredGuest(ctx, a); err != nil {
		t.Fatalf("freshen: %v (one call waited for the other)", err)
	}
	if a.gotTime.Before(before) || a.gotEntropyLength != 64 {
		t.Errorf("time %v (before %v), %d bytes of entropy", a.gotTime, before, a.gotEntropyLength)
	}
	for _, c := range []struct {
		timeErr, rngErr error
		want            string
	}{
		{errors.New("clock"), nil, "set guest time: clock"},
		{nil, errors.New("pool"), "reseed guest rng: pool"},
		{errors.New("clock"), errors.New("pool"), "set guest time: clock"},
	} {
		a := newAgent()
		a.timeErr, a.rngErr = c.timeErr, c.rngErr
		if err := freshenRestoredGuest(ctx, a); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("errors %v, %v: freshen %v, want %q", c.timeErr, c.rngErr, err, c.want)
		}
	}
}
