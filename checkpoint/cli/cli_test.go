package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cube-runtime/cube/checkpoint/shimclient"
)

// run runs cube with args in env e and returns the exit status, stdout, stderr.
func run(t *testing.T, e Env, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	e.Stdout, e.Stderr = &out, &errOut
	if e.Getenv == nil {
		e.Getenv = func(string) string { return "" }
	}
	code := Run(context.Background(), args, e)
	return code, out.String(), errOut.String()
}

func TestHelp(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--help"}, []string{"Usage: cube [global flags] COMMAND", "--store-root DIR", "CONTAINERD_ADDRESS", "snapshots rm"}},
		{[]string{"help"}, []string{"Usage: cube [global flags] COMMAND"}},
		{[]string{"-h"}, []string{"Usage: cube [global flags] COMMAND"}},
		{[]string{"snapshot", "--help"}, []string{"Usage: cube snapshot CONTAINER", "--name NAME", "--incremental", "--quiet, -q", "--json", "busy", "--namespace NS"}},
		{[]string{"help", "snapshot"}, []string{"Usage: cube snapshot CONTAINER"}},
		{[]string{"snapshots", "--help"}, []string{"Usage: cube snapshots COMMAND", "ls [--sandbox S]"}},
		{[]string{"snapshots", "ls", "-h"}, []string{"Usage: cube snapshots ls", "--sandbox S", "NAMESPACE/S", "--quiet, -q"}},
		{[]string{"snapshots", "inspect", "--help"}, []string{"Usage: cube snapshots inspect ID|NAME", "holders", `"vm"`}},
		{[]string{"help", "snapshots", "rm"}, []string{"Usage: cube snapshots rm ID|NAME...", "parent"}},
	} {
		code, out, errOut := run(t, Env{}, c.args...)
		if code != ExitOK || errOut != "" {
			t.Errorf("cube %v: exit %d, stderr %q", c.args, code, errOut)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("cube %v: help lacks %q:\n%s", c.args, w, out)
			}
		}
	}
}

func TestUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "Usage: cube"},
		{[]string{"frob"}, `cube: unknown command "frob"`},
		{[]string{"--bogus"}, "cube: flag provided but not defined: -bogus"},
		{[]string{"snapshot"}, "cube snapshot: want one CONTAINER, got 0 arguments"},
		{[]string{"snapshot", "a", "b"}, "want one CONTAINER, got 2"},
		{[]string{"snapshot", "c1", "--bogus"}, "cube snapshot: flag provided but not defined: -bogus\nRun 'cube snapshot --help' for usage."},
		{[]string{"snapshot", "c1", "--name"}, "flag needs an argument: -name"},
		{[]string{"snapshot", "c1", "-q", "--json"}, "--quiet and --json exclude each other"},
		{[]string{"snapshots"}, "cube snapshots: want a command: ls, inspect or rm"},
		{[]string{"snapshots", "frob"}, `unknown command "frob" (commands: ls, inspect, rm)`},
		{[]string{"snapshots", "ls", "c1"}, "takes no arguments"},
		{[]string{"snapshots", "inspect"}, "want one ID or NAME, got 0"},
		{[]string{"snapshots", "rm"}, "want at least one ID or NAME"},
		{[]string{"help", "nope"}, `no command "nope"`},
	} {
		code, _, errOut := run(t, Env{}, c.args...)
		if code != ExitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("cube %v: exit %d, stderr %q; want %d and %q", c.args, code, errOut, ExitUsage, c.want)
		}
	}
}

// recordingContainers remembers how it was connected.
type recordingContainers struct {
	address, ns string
}

func (r *recordingContainers) Container(ctx context.Context, id string) (shimclient.Container, error) {
	return shimclient.Container{}, fmt.Errorf("no container %s in namespace %s: %w", id, r.ns, errdefs.ErrNotFound)
}

func TestGlobalFlagsAndEnvironment(t *testing.T) {
	rec := &recordingContainers{}
	e := Env{Containers: func(ctx context.Context, address, ns string) (shimclient.Containers, io.Closer, error) {
		rec.address, rec.ns = address, ns
		return rec, io.NopCloser(nil), nil
	}}
	// Defaults: ctr's.
	code, _, errOut := run(t, e, "snapshot", "c1")
	if code != ExitFailure || rec.address != "/run/containerd/containerd.sock" || rec.ns != "default" ||
		!strings.Contains(errOut, "cube snapshot: no container c1 in namespace default") {
		t.Fatalf("defaults: exit %d, %+v, %q", code, rec, errOut)
	}
	// The environment, then flags before and after the command.
	e.Getenv = func(k string) string {
		return map[string]string{EnvAddress: "/env.sock", EnvNamespace: "envns"}[k]
	}
	run(t, e, "snapshot", "c1")
	if rec.address != "/env.sock" || rec.ns != "envns" {
		t.Fatalf("environment: %+v", rec)
	}
	run(t, e, "-n", "before", "snapshot", "c1")
	if rec.ns != "before" {
		t.Fatalf("-n before the command: %+v", rec)
	}
	run(t, e, "--namespace", "before", "snapshot", "c1", "--address", "/after.sock", "-n", "after")
	if rec.address != "/after.sock" || rec.ns != "after" {
		t.Fatalf("flags after the command: %+v", rec)
	}
}

func TestParseInterleaved(t *testing.T) {
	r := &runner{}
	fs := r.flagSet("x")
	var ns names
	fs.Var(&ns, "name", "")
	inc := fs.Bool("incremental", false, "")
	pos, err := parse(fs, []string{"--name", "a", "c1", "--incremental", "--name=b", "--", "--not-a-flag"})
	if err != nil || strings.Join(pos, " ") != "c1 --not-a-flag" || !*inc || ns.String() != "a,b" {
		t.Fatalf("parse: %q %v, incremental %v, names %v", pos, err, *inc, ns)
	}
}

func TestBytesHuman(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 3 << 20: "3.0 MiB", 5 << 30: "5.0 GiB"} {
		if got := bytesHuman(n); got != want {
			t.Errorf("bytesHuman(%d) = %q, want %q", n, got, want)
		}
	}
}
