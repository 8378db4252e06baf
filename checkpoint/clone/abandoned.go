package clone

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/cube-runtime/cube/shim/procstat"
)

// LabelForkPending marks a clone while its fork runs: "<op>/<pid>/<start>",
// the fork's operation and the process running it (pid and its start time
// in clock ticks since boot, /proc/<pid>/stat field 22: a pid reused by
// another process has another start time). Fork removes it from every clone
// it keeps; a clone that still carries it once that process is gone was
// left by a fork that crashed, and CollectAbandoned removes it.
const LabelForkPending = "io.cube.fork.pending"

// Finisher is a Maker that can drop a label of a container (a fork's kept
// clones lose LabelForkPending). Without it the label stays, and a later
// collection would take the clones for abandoned ones: Fork refuses a
// Maker that is not one.
type Finisher interface {
	DropLabel(ctx context.Context, id, label string) error
}

// Lister is a Maker that can list the containers carrying a label, with
// its value.
type Lister interface {
	Labelled(ctx context.Context, label string) (map[string]string, error)
}

// pendingValue is this process's LabelForkPending value for op.
func pendingValue(op string) (string, error) {
	start, err := processStart(os.Getpid())
	if err != nil {
		return "", fmt.Errorf("fork: this process's start time: %w", err)
	}
	return fmt.Sprintf("%s/%d/%d", op, os.Getpid(), start), nil
}

// processStart is pid's start time in clock ticks since boot.
func processStart(pid int) (uint64, error) {
	st, err := procstat.Read(pid)
	return st.Start, err
}

// forkAlive says whether the fork that wrote a LabelForkPending value still
// runs. A value that does not parse counts as dead (nothing but a fork
// writes it).
func forkAlive(v string) bool {
	parts := strings.Split(v, "/")
	if len(parts) != 3 {
		return false
	}
	pid, err1 := strconv.Atoi(parts[1])
	start, err2 := strconv.ParseUint(parts[2], 10, 64)
	if err1 != nil || err2 != nil || pid <= 0 {
		return false
	}
	now, err := processStart(pid)
	return err == nil && now == start
}

// Collected is what CollectAbandoned removed, and what it could not.
type Collected struct {
	Removed []string
	Failed  map[string]error
}

// CollectAbandoned removes the clones of forks whose process is gone (it
// crashed, or was killed, between making a clone and finishing). Forks
// still running are left alone. m must be a Lister.
func CollectAbandoned(ctx context.Context, m Maker) (Collected, error) {
	l, ok := m.(Lister)
	if !ok {
		return Collected{}, fmt.Errorf("collect abandoned clones: this maker cannot list containers by label")
	}
	ids, err := l.Labelled(ctx, LabelForkPending)
	if err != nil {
		return Collected{}, fmt.Errorf("collect abandoned clones: %w", err)
	}
	var out Collected
	for id, v := range ids {
		if forkAlive(v) {
			continue
		}
		if err := m.Remove(ctx, id); err != nil {
			if out.Failed == nil {
				out.Failed = map[string]error{}
			}
			out.Failed[id] = err
			continue
		}
		out.Removed = append(out.Removed, id)
	}
	return out, nil
}
