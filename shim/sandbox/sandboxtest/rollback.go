package sandboxtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"

	"github.com/cube-runtime/cube/shim/sandbox"
)

var errReset = errors.New("fake agent: connection reset (transport reset: the VM rolled back)")

// AgentState is the fake agent's processes at a snapshot (VMM.Snapshot
// saves it, VMM.Rollback restores it).
type AgentState struct {
	containers map[string]containerState
	// trees: what SyncTree wrote (the guest's copies of host volumes).
	trees map[string]sandbox.Tree
}

type containerState struct {
	rootfs string
	procs  map[string]procState
}

type procState struct {
	args     []string
	terminal bool
	pid      uint32
	want     sandbox.StdioFlags
	state    string
	exit     sandbox.ExitStatus
}

// Save returns the agent's processes as they are now.
func (a *Agent) Save() *AgentState {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := &AgentState{containers: map[string]containerState{}, trees: map[string]sandbox.Tree{}}
	for d, t := range a.trees {
		st.trees[d] = t
	}
	for id, c := range a.containers {
		cs := containerState{rootfs: c.rootfs, procs: map[string]procState{}}
		for eid, p := range c.procs {
			cs.procs[eid] = procState{args: append([]string(nil), p.args...), terminal: p.terminal, pid: p.pid,
				want: p.want, state: p.state, exit: p.exit}
		}
		st.containers[id] = cs
	}
	return st
}

// Restore brings the processes back to st, as a rollback of the VM does:
// every connection is reset (pending Waits fail, streams end), processes
// made since are gone, processes that exited since run again with their old
// pid, and the rest go on.
func (a *Agent) Restore(st *AgentState) {
	a.mu.Lock()
	close(a.resetCh)
	a.resetCh = make(chan struct{})
	a.trees = map[string]sandbox.Tree{}
	for d, t := range st.trees {
		a.trees[d] = t
	}
	for _, c := range a.containers {
		for _, p := range c.procs {
			for s, f := range p.guest {
				f.Close()
				delete(p.guest, s)
			}
		}
	}
	var start []*proc
	keep := map[*proc]bool{}
	next := map[string]*container{}
	for id, cs := range st.containers {
		nc := &container{id: id, rootfs: cs.rootfs, procs: map[string]*proc{}}
		var cur *container
		if c, ok := a.containers[id]; ok {
			cur = c
		}
		for eid, ps := range cs.procs {
			if cur != nil {
				if p := cur.procs[eid]; p != nil && p.pid == ps.pid && p.state == ps.state {
					nc.procs[eid], keep[p] = p, true
					continue
				}
			}
			np := &proc{args: ps.args, terminal: ps.terminal, pid: ps.pid, want: ps.want, guest: map[sandbox.Stream]*os.File{},
				state: ps.state, exit: ps.exit, sig: make(chan uint32, 8), exited: make(chan struct{}), gone: make(chan struct{})}
			switch ps.state {
			case "stopped":
				close(np.exited)
			case "running":
				start = append(start, np)
			}
			nc.procs[eid] = np
		}
		next[id] = nc
	}
	for _, c := range a.containers {
		for _, p := range c.procs {
			if !keep[p] {
				close(p.gone)
			}
		}
	}
	a.containers = next
	a.mu.Unlock()
	for _, p := range start {
		go a.run(p)
	}
}

// ListProcesses lists every process the fake holds, by container then exec id.
func (a *Agent) ListProcesses(ctx context.Context) ([]sandbox.GuestProcess, error) {
	if err := a.enter("ListProcesses"); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []sandbox.GuestProcess
	for id, c := range a.containers {
		for eid, p := range c.procs {
			g := sandbox.GuestProcess{ContainerID: id, ExecID: eid, Pid: p.pid, Status: p.state, Stdio: p.want, Terminal: p.terminal}
			if p.state == "stopped" {
				g.Exit = p.exit
			}
			out = append(out, g)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].ContainerID != out[j].ContainerID {
			return out[i].ContainerID < out[j].ContainerID
		}
		return out[i].ExecID < out[j].ExecID
	})
	return out, nil
}

// ProcessStatus returns the fake's status of a process ("" when it has none).
func (a *Agent) ProcessStatus(cid, eid string) string {
	p, err := a.lookup(cid, eid)
	if err != nil {
		return ""
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return p.state
}

// RenameContainer gives container cid the id newID (as the agent does
// after a restore under another containerd id).
func (a *Agent) RenameContainer(ctx context.Context, cid, newID string) error {
	if err := a.enter("RenameContainer"); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.RenameErr != nil {
		return a.RenameErr
	}
	c, ok := a.containers[cid]
	if !ok {
		return fmt.Errorf("container %s: not found", cid)
	}
	if _, taken := a.containers[newID]; taken && newID != cid {
		return fmt.Errorf("container %s: already exists", newID)
	}
	delete(a.containers, cid)
	c.id = newID
	a.containers[newID] = c
	return nil
}
