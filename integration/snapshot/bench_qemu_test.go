package snapshot

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/cube-runtime/cube/integration/benchloss"
)

// QEMU, the peer of the benchmarks, with errors classified as cube-vmm's are (bench_cube_test.go): QEMU runs
// with -no-reboot, so a guest reset ends it (status 0: benchloss.QEMUReset) instead of rebooting the guest
// unseen; a QMP command without an answer is a stall; a QMP error answer is a real failure.

type qmp struct {
	p *proc
	c net.Conn
	r *bufio.Reader
}

func dialQMPErr(p *proc, sock string, timeout time.Duration) (*qmp, error) {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.Dial("unix", sock)
		if err == nil {
			q := &qmp{p: p, c: c, r: bufio.NewReader(c)}
			c.SetReadDeadline(time.Now().Add(opTimeout))
			if _, err := q.r.ReadString('\n'); err != nil { // greeting
				c.Close()
				return nil, q.failed("greeting", err)
			}
			if _, err := q.doErr("qmp_capabilities", nil); err != nil {
				c.Close()
				return nil, err
			}
			return q, nil
		}
		if p.exited() {
			return nil, benchloss.Exited(p.cmd.ProcessState, p.reset, fmt.Errorf("qemu exited (%v): %w\n%s", p.cmd.ProcessState, err, p.tail()))
		}
		if time.Now().After(deadline) {
			return nil, benchloss.Stalled(fmt.Errorf("qmp socket %s: %w\n%s", sock, err, p.tail()))
		}
		time.Sleep(time.Millisecond)
	}
}

// failed classifies a QMP connection's failure: no answer in opTimeout is a stall; a QEMU that exited
// meanwhile says by its status whether the VM was lost.
func (q *qmp) failed(cmd string, err error) error {
	err = fmt.Errorf("qmp %s: %w", cmd, err)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return benchloss.Stalled(fmt.Errorf("%w (no answer in %v)\n%s", err, opTimeout, q.p.tail()))
	}
	return q.p.ended(err)
}

func (q *qmp) doErr(cmd string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	q.c.SetDeadline(time.Now().Add(opTimeout))
	if _, err := q.c.Write(append(b, '\n')); err != nil {
		return nil, q.failed(cmd, err)
	}
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			if cmd == "quit" {
				return nil, nil
			}
			return nil, q.failed(cmd, err)
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Desc string `json:"desc"`
			} `json:"error"`
			Event string `json:"event"`
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			return nil, fmt.Errorf("qmp %s: %q: %w", cmd, line, err)
		}
		if resp.Event != "" {
			continue
		}
		if resp.Error != nil {
			return nil, fmt.Errorf("qmp %s: %s\n%s", cmd, resp.Error.Desc, q.p.tail())
		}
		return resp.Return, nil
	}
}

// statusErr is QEMU's run state. A guest that died in the nested KVM (internal-error: KVM could not go on with
// it) is a lost VM.
func (q *qmp) statusErr() (string, error) {
	raw, err := q.doErr("query-status", nil)
	if err != nil {
		return "", err
	}
	var s struct {
		Status string `json:"status"`
	}
	json.Unmarshal(raw, &s)
	if s.Status == "internal-error" {
		return s.Status, benchloss.Lost("the nested guest died: QEMU status internal-error", fmt.Errorf("qemu: status %s\n%s", s.Status, q.p.tail()))
	}
	return s.Status, nil
}

type qemuVM struct {
	p *proc
	q *qmp
}

func qemuArgs(sock string, memMiB, randMiB int) []string {
	return []string{"-enable-kvm", "-M", "pc", "-cpu", "host", "-smp", "1", "-m", fmt.Sprint(memMiB),
		"-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", guestKernel, "-initrd", benchInitrd, "-append", fmt.Sprintf("%s bench.rand=%d", benchCmdline, randMiB),
		"-qmp", "unix:" + sock + ",server=on,wait=off"}
}

func bootQEMUErr(dir string, memMiB, randMiB int) (*qemuVM, error) {
	sock := filepath.Join(dir, "qemu-qmp.sock")
	p, err := startProcErr("qemu-system-x86_64", qemuArgs(sock, memMiB, randMiB)...)
	if err != nil {
		return nil, err
	}
	v := &qemuVM{p: p}
	if v.q, err = dialQMPErr(p, sock, time.Minute); err == nil {
		_, err = p.waitLineErr("BENCH-READY", 5*time.Minute)
	}
	if err == nil {
		// QEMU at its fastest: no migration bandwidth cap (the default is 128 MiB/s).
		_, err = v.q.doErr("migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40})
	}
	if err != nil {
		v.kill()
		return nil, err
	}
	return v, nil
}

// saveErr migrates the running VM to file and returns the time from the migrate command to "completed" and
// QEMU's own downtime figure (the VM stopped); the VM is then continued (untimed).
func (v *qemuVM) saveErr(file string) (time.Duration, time.Duration, error) {
	t0 := time.Now()
	if _, err := v.q.doErr("migrate", map[string]any{"uri": "file:" + file}); err != nil {
		return 0, 0, err
	}
	for {
		var m struct {
			Status   string `json:"status"`
			Downtime int64  `json:"downtime"` // ms
		}
		raw, err := v.q.doErr("query-migrate", nil)
		if err != nil {
			return 0, 0, err
		}
		json.Unmarshal(raw, &m)
		if m.Status == "completed" {
			d := time.Since(t0)
			_, err := v.q.doErr("cont", nil)
			return d, time.Duration(m.Downtime) * time.Millisecond, err
		}
		if m.Status == "failed" || m.Status == "cancelled" {
			return 0, 0, fmt.Errorf("qemu migrate to %s: %s\n%s", file, m.Status, v.p.tail())
		}
		if time.Since(t0) > opTimeout {
			return 0, 0, benchloss.Stalled(fmt.Errorf("qemu migrate to %s: still %q after %v\n%s", file, m.Status, opTimeout, v.p.tail()))
		}
		time.Sleep(time.Millisecond)
	}
}

// stopErr quits QEMU and waits for it; one that does not exit is killed (a stall).
func (v *qemuVM) stopErr() error {
	_, err := v.q.doErr("quit", nil)
	if err == nil {
		err = benchloss.Stalled(v.p.waitExit(time.Minute))
	}
	v.kill()
	return err
}

func (v *qemuVM) kill() {
	if v.q != nil {
		v.q.c.Close()
	}
	v.p.kill()
}

// loadQEMUErr launches QEMU with -incoming from file and returns the time from the launch to the VM running.
func loadQEMUErr(dir, file string, memMiB, randMiB int) (time.Duration, error) {
	sock := filepath.Join(dir, "qemu-in.sock")
	t0 := time.Now()
	p, err := startProcErr("qemu-system-x86_64", append(qemuArgs(sock, memMiB, randMiB), "-incoming", "file:"+file)...)
	if err != nil {
		return 0, err
	}
	v := &qemuVM{p: p}
	if v.q, err = dialQMPErr(p, sock, time.Minute); err != nil {
		p.kill()
		return 0, err
	}
	for {
		s, err := v.q.statusErr()
		if err == nil && s != "running" && time.Since(t0) > opTimeout {
			err = benchloss.Stalled(fmt.Errorf("qemu -incoming %s: still %q after %v\n%s", file, s, opTimeout, p.tail()))
		}
		if err != nil {
			v.kill()
			return 0, err
		}
		if s == "running" {
			break
		}
		time.Sleep(time.Millisecond)
	}
	d := time.Since(t0)
	return d, v.stopErr()
}
