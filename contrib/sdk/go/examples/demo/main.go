// Command demo is the story Cube is built for, told through the Go SDK
// against a running cube-api: a sandbox runs a process, is snapshotted,
// breaks something, is rolled back in place with that process, its PID and
// its files intact, and is forked into copies that start from the same
// state and then diverge. Every step checks what it claims and the program
// exits 1 when one does not hold; everything it made is removed at the end.
//
//	CUBE_API_URL=http://127.0.0.1:3000 CUBE_API_KEY=… go run ./contrib/sdk/go/examples/demo -template docker.io/library/busybox:latest
//
// `make demo` runs it in the test host against a cube-api it starts there.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	cube "github.com/cube-runtime/cube/contrib/sdk/go"
)

// counterCmd is the sandbox's long-lived process: a shell loop whose only
// state is in its memory (i) and mirrored to a file for reading.
const counterCmd = `i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done`

func main() {
	c := cube.NewClient()
	flag.StringVar(&c.URL, "url", c.URL, "cube-api's base URL (env "+cube.EnvAPIURL+")")
	flag.StringVar(&c.APIKey, "api-key", c.APIKey, "cube-api's key (env "+cube.EnvAPIKey+")")
	image := flag.String("template", envOr(cube.EnvTemplateID, ""), "image or template to create the sandbox from; it needs /bin/sh and sleep (env "+cube.EnvTemplateID+")")
	forks := flag.Int("fork", 2, "how many copies to fork")
	timeout := flag.Duration("timeout", 10*time.Minute, "time limit of the whole demo")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: demo [flags]\n\nSnapshot, roll back and fork a running sandbox through cube-api with the Go SDK.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *image == "" {
		fmt.Fprintln(os.Stderr, "demo: -template is required: the image (e.g. docker.io/library/busybox:latest, imported with `ctr -n <cube-api's namespace> images import --snapshotter cube`) or template id to start from")
		os.Exit(2)
	}
	if *forks < 1 {
		fmt.Fprintln(os.Stderr, "demo: -fork must be at least 1")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	d := &demo{c: c}
	err := d.run(ctx, *image, *forks)
	d.cleanup()
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: FAILED: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("demo: every step held")
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

type demo struct {
	c         *cube.Client
	made      []*cube.Sandbox
	snapshots []string
	step      int
}

func (d *demo) say(format string, a ...any) {
	d.step++
	fmt.Printf("%d. %s\n", d.step, fmt.Sprintf(format, a...))
}

func since(t time.Time) string { return time.Since(t).Round(time.Millisecond).String() }

func (d *demo) run(ctx context.Context, image string, forks int) error {
	if err := d.c.Health(ctx); err != nil {
		return fmt.Errorf("cube-api at %s does not answer: %w (start it with `cube-api --config …`, or set %s)", d.c.URL, err, cube.EnvAPIURL)
	}
	fmt.Printf("Cube demo: the Go SDK against cube-api at %s\n", d.c.URL)

	t := time.Now()
	sb, err := d.c.Create(ctx, cube.CreateOptions{Template: image, Timeout: 600, Metadata: map[string]string{"demo": "1"}})
	if err != nil {
		return fmt.Errorf("create a sandbox from %s: %w", image, err)
	}
	d.made = append(d.made, sb)
	d.say("created sandbox %s from %s: its own microVM (%s)", sb.ID, image, since(t))

	counter, err := sb.Commands.Start(ctx, counterCmd, cube.RunOptions{})
	if err != nil {
		return fmt.Errorf("start the counter: %w", err)
	}
	counter.Disconnect()
	at, err := waitCount(ctx, sb, 5)
	if err != nil {
		return err
	}
	d.say("a background process (pid %d) counts in its memory: %d", counter.Pid, at)

	const notes = "/tmp/notes.txt"
	if _, err := sb.Files.Write(ctx, notes, []byte("draft 1\n")); err != nil {
		return fmt.Errorf("write %s: %w", notes, err)
	}
	before, err := readCount(ctx, sb)
	if err != nil {
		return err
	}
	snap, err := sb.CreateSnapshot(ctx, "before-experiment")
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	d.snapshots = append(d.snapshots, snap.SnapshotID)
	d.say("snapshot %s (%q): the VM frozen %.0f ms, %.0f ms in all, %d MiB; the counter was past %d", snap.SnapshotID, "before-experiment",
		snap.FrozenMs, snap.TotalMs, snap.SizeBytes>>20, before)

	// The counter is killed through the API (the agent signals it by its guest PID, as listed), the file
	// removed by a command.
	if _, err := sb.Commands.Run(ctx, "rm -f "+notes, cube.RunOptions{}); err != nil {
		return fmt.Errorf("the experiment: %w", err)
	}
	if err := sb.Commands.Kill(ctx, counter.Pid, nil); err != nil {
		return fmt.Errorf("the experiment: SIGKILL the counter (pid %d): %w", counter.Pid, err)
	}
	if ok, _ := sb.Files.Exists(ctx, notes); ok {
		return fmt.Errorf("%s still exists after rm", notes)
	}
	if err := waitGone(ctx, sb, counter.Pid); err != nil {
		return err
	}
	d.say("the experiment goes wrong: %s deleted, the counter killed", notes)

	t = time.Now()
	rb, err := sb.Rollback(ctx, snap.SnapshotID)
	if err != nil {
		return fmt.Errorf("rollback to %s: %w", snap.SnapshotID, err)
	}
	got, err := sb.Files.Read(ctx, notes)
	if err != nil || string(got) != "draft 1\n" {
		return fmt.Errorf("after the rollback %s reads %q, %v; want %q", notes, got, err, "draft 1\n")
	}
	if alive, err := hasPid(ctx, sb, counter.Pid); err != nil || !alive {
		return fmt.Errorf("after the rollback the counter (pid %d) is not listed (%v)", counter.Pid, err)
	}
	back, err := readCount(ctx, sb)
	if err != nil {
		return err
	}
	if back < before {
		return fmt.Errorf("after the rollback the counter reads %d; it was past %d at the snapshot (a new process, not the old one?)", back, before)
	}
	if _, err := waitCount(ctx, sb, back+3); err != nil {
		return fmt.Errorf("after the rollback: %w", err)
	}
	d.say("rolled back in place (frozen %.0f ms, %.0f ms in the shim, %s as the SDK saw it): %s is back, pid %d runs again from %d and counts on",
		rb.FrozenMs, rb.TotalMs, since(t), notes, counter.Pid, back)

	t = time.Now()
	items, err := sb.Fork(ctx, forks, cube.ForkOptions{AllOrNothing: true, Timeout: 600})
	for _, it := range items {
		if it.Sandbox != nil {
			d.made = append(d.made, it.Sandbox)
		}
	}
	if err != nil {
		return fmt.Errorf("fork %d: %w", forks, err)
	}
	var ids []string
	for i, it := range items {
		if it.Sandbox == nil {
			return fmt.Errorf("fork item %d: %v", i, it.Err)
		}
		ids = append(ids, it.Sandbox.ID)
	}
	d.say("forked %d copies of the running sandbox in %s: %s", forks, since(t), strings.Join(ids, ", "))

	for i, it := range items {
		clone := it.Sandbox
		got, err := clone.Files.Read(ctx, notes)
		if err != nil || string(got) != "draft 1\n" {
			return fmt.Errorf("clone %s: %s reads %q, %v", clone.ID, notes, got, err)
		}
		if alive, err := hasPid(ctx, clone, counter.Pid); err != nil || !alive {
			return fmt.Errorf("clone %s: the counter (pid %d) is not listed (%v)", clone.ID, counter.Pid, err)
		}
		mine := fmt.Sprintf("clone %d\n", i)
		if _, err := clone.Files.Write(ctx, notes, []byte(mine)); err != nil {
			return fmt.Errorf("clone %s: write: %w", clone.ID, err)
		}
	}
	for i, it := range items {
		got, err := it.Sandbox.Files.Read(ctx, notes)
		if want := fmt.Sprintf("clone %d\n", i); err != nil || string(got) != want {
			return fmt.Errorf("clone %s: its own write reads back %q, %v; want %q", it.Sandbox.ID, got, err, want)
		}
	}
	if got, err := sb.Files.Read(ctx, notes); err != nil || string(got) != "draft 1\n" {
		return fmt.Errorf("the source's %s reads %q, %v after the clones wrote theirs", notes, got, err)
	}
	d.say("each copy has the counter (pid %d) and %s; their writes stay their own, the source is untouched", counter.Pid, notes)
	return nil
}

// cleanup kills every sandbox made and deletes the snapshot, best effort,
// saying what it could not remove.
func (d *demo) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, sb := range d.made {
		if err := sb.Kill(ctx); err != nil && !cube.IsNotFound(err) {
			fmt.Fprintf(os.Stderr, "demo: cleanup: kill %s: %v\n", sb.ID, err)
		}
	}
	for _, id := range d.snapshots {
		if err := d.c.DeleteSnapshot(ctx, id); err != nil && !cube.IsNotFound(err) {
			fmt.Fprintf(os.Stderr, "demo: cleanup: delete snapshot %s: %v\n", id, err)
		}
	}
	fmt.Printf("cleaned up: %d sandboxes killed, %d snapshots deleted\n", len(d.made), len(d.snapshots))
}

func readCount(ctx context.Context, sb *cube.Sandbox) (int, error) {
	b, err := sb.Files.Read(ctx, "/tmp/count")
	if err != nil {
		return 0, fmt.Errorf("read the counter: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("the counter file holds %q", b)
	}
	return n, nil
}

// waitCount waits until the counter reads at least n.
func waitCount(ctx context.Context, sb *cube.Sandbox, n int) (int, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		v, err := readCount(ctx, sb)
		if err == nil && v >= n {
			return v, nil
		}
		if time.Now().After(deadline) {
			return v, fmt.Errorf("the counter does not reach %d in a minute (at %d, %v)", n, v, err)
		}
		select {
		case <-ctx.Done():
			return v, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitGone waits until pid is no longer among the sandbox's commands.
func waitGone(ctx context.Context, sb *cube.Sandbox, pid uint32) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		alive, err := hasPid(ctx, sb, pid)
		if err != nil {
			return fmt.Errorf("list commands: %w", err)
		}
		if !alive {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pid %d is still listed 30 s after kill -9", pid)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func hasPid(ctx context.Context, sb *cube.Sandbox, pid uint32) (bool, error) {
	list, err := sb.Commands.List(ctx)
	if err != nil {
		return false, err
	}
	for _, c := range list {
		if c.Pid == pid {
			return true, nil
		}
	}
	return false, nil
}
