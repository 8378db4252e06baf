package main

import (
	"testing"

	"github.com/containerd/containerd/v2/pkg/shim"
)

// The shim reaps its own children (os/exec): containerd's library must not (see ownChildren).
func TestOwnChildren(t *testing.T) {
	var c shim.Config
	ownChildren(&c)
	if !c.NoReaper || !c.NoSubreaper {
		t.Fatalf("shim config %+v: want NoReaper and NoSubreaper", c)
	}
}
