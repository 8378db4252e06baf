// Package vmmtest is a stand-in cube-vmm process for tests of code that
// launches the real binary (it imports nothing of ours but the control
// protocol types, so any test may use it).
package vmmtest

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"

	"github.com/cube-runtime/cube/hypervisor/control"
)

type diskFlags []string

func (d *diskFlags) String() string     { return strings.Join(*d, ";") }
func (d *diskFlags) Set(v string) error { *d = append(*d, v); return nil }

// IsFakeVMMArgs reports whether a re-executed test binary was started as a
// VMM (its first flag is -kernel, as ProcessVMM passes it).
func IsFakeVMMArgs(args []string) bool {
	return len(args) > 0 && (args[0] == "-kernel" || args[0] == "--kernel")
}

// FakeVMMMain parses cube-vmm's flags as ProcessVMM passes them, serves the
// JSON-lines control socket (pause, resume, stop, info, and disk-set, which
// the real cube-vmm does not have yet) and the hybrid vsock socket (answers
// CONNECT with OK and echoes), and logs to the -console file. It exits with
// 12 on stop, like cube-vmm; -kernel crash makes it exit 3 at once.
func FakeVMMMain(args []string) int {
	fs := flag.NewFlagSet("cube-vmm", flag.ContinueOnError)
	var disks diskFlags
	kernel := fs.String("kernel", "", "")
	fs.String("initrd", "", "")
	fs.String("cmdline", "", "")
	mem := fs.Uint("memory", 0, "")
	fs.Uint("vcpus", 0, "")
	fs.Var(&disks, "disk", "")
	vs := fs.String("vsock", "", "")
	fs.Uint("vsock-cid", 0, "")
	ctl := fs.String("control", "", "")
	console := fs.String("console", "", "")
	fs.String("console-input", "", "")
	fs.String("restore", "", "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *kernel == "crash" {
		return 3
	}
	if *mem == 0 || *vs == "" || *ctl == "" {
		fmt.Fprintln(os.Stderr, "missing flags")
		return 2
	}
	logf := func(format string, a ...any) {
		f, err := os.OpenFile(*console, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err == nil {
			fmt.Fprintf(f, format, a...)
			f.Close()
		}
	}
	logf("disks=%s\n", disks.String())
	vl, err := net.Listen("unix", *vs)
	if err != nil {
		return 4
	}
	cl, err := net.Listen("unix", *ctl)
	if err != nil {
		return 4
	}
	go func() {
		for {
			c, err := vl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				if _, err := r.ReadString('\n'); err != nil {
					return
				}
				io.WriteString(c, "OK 99\n")
				io.Copy(c, r)
			}()
		}
	}()
	for {
		c, err := cl.Accept()
		if err != nil {
			return 5
		}
		var req struct{ Op, Serial, Path string }
		line, _ := bufio.NewReader(c).ReadBytes('\n')
		resp := control.Response{OK: true}
		if err := json.Unmarshal(line, &req); err != nil {
			resp = control.Response{Error: "bad request"}
		}
		switch req.Op {
		case "pause", "resume", "info":
		case "stop":
			json.NewEncoder(c).Encode(resp)
			c.Close()
			return 12
		case "disk-set":
			logf("disk-set %s %s\n", req.Serial, req.Path)
		default:
			resp = control.Response{Error: fmt.Sprintf("unknown op %q", req.Op)}
		}
		json.NewEncoder(c).Encode(resp)
		c.Close()
	}
}
