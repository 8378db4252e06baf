// Command cube-testhost runs a program inside the test host (QEMU/TCG with an emulated AMD-V CPU and nested
// KVM) and exits with the program's status. See integration/testhost.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/cube-runtime/cube/integration/testhost"
	"github.com/sirupsen/logrus"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	var o testhost.Options
	var modules, tools, files, env listFlag
	fs := flag.NewFlagSet("cube-testhost", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: cube-testhost [flags] -- PROGRAM [ARGS...]

Boots the test host (qemu-system-x86_64 -accel tcg -cpu EPYC,+svm,+npt with Debian's cloud kernel and
kvm-amd loaded, so /dev/kvm inside is real KVM), runs PROGRAM (a host binary, copied in with its shared
libraries) and exits with its status. Artifacts are cached in %s (override with -cache or $%s).

Flags:
`, testhost.DefaultCacheDir(), testhost.EnvCacheDir)
		fs.PrintDefaults()
	}
	fs.IntVar(&o.MemoryMiB, "memory", testhost.DefaultMemoryMiB, "test host RAM in MiB")
	fs.IntVar(&o.CPUs, "cpus", testhost.DefaultCPUs, "test host vCPUs")
	fs.DurationVar(&o.Timeout, "timeout", testhost.DefaultTimeout, "limit for the whole run, boot included")
	fs.IntVar(&o.DiskMiB, "disk", testhost.DefaultDiskMiB, "free MiB on the root disk")
	fs.StringVar(&o.CacheDir, "cache", "", "artifact cache directory")
	fs.Var(&modules, "module", "extra kernel module to load (repeatable), e.g. loop, xfs, vsock")
	fs.Var(&tools, "tool", "host program to install inside with its libraries (repeatable)")
	fs.Var(&files, "file", "INSIDE=HOSTPATH: copy a host file or directory in (repeatable)")
	fs.Var(&env, "env", "KEY=value for the program's environment (repeatable)")
	verbose := fs.Bool("v", false, "log artifact building and the QEMU command line")
	buildQEMU := fs.Bool("build-qemu", false, "only find or build the test host's QEMU (see $"+testhost.EnvQEMUVariant+") and print its path; nothing boots")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if *buildQEMU {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		q, err := testhost.QEMUBinary(ctx, testhost.Options{CacheDir: o.CacheDir})
		if err != nil {
			fmt.Fprintf(os.Stderr, "cube-testhost: %v\n", err)
			os.Exit(1)
		}
		fmt.Println(q)
		return
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "cube-testhost: no PROGRAM given (usage: cube-testhost [flags] -- PROGRAM [ARGS...]; see -h)")
		os.Exit(2)
	}
	if *verbose {
		logrus.SetLevel(logrus.DebugLevel)
	}
	o.Modules, o.Tools, o.Env = modules, tools, env
	o.Files = map[string]string{}
	for _, f := range files {
		in, host, ok := strings.Cut(f, "=")
		if !ok || in == "" || host == "" {
			fmt.Fprintf(os.Stderr, "cube-testhost: -file %q: want INSIDE=HOSTPATH, e.g. -file /cube/vmlinuz=./vmlinuz\n", f)
			os.Exit(2)
		}
		o.Files[in] = host
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	res, err := testhost.Run(ctx, o, testhost.Payload{Binary: fs.Arg(0), Args: fs.Args()[1:]}, os.Stdout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cube-testhost: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "cube-testhost: boot to payload %.2fs, wall %.2fs (total %.2fs), payload exit %d\n",
		res.Boot.Seconds(), res.Wall.Seconds(), time.Since(start).Seconds(), res.ExitCode)
	if res.ExitCode != 0 {
		fmt.Fprintf(os.Stderr, "--- test host console (tail) ---\n%s\n", res.ConsoleTail(40))
	}
	os.Exit(res.ExitCode)
}
