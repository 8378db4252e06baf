// Command cube-agent is the guest's /init: it boots the microVM's userland
// and serves the Cube agent protocol on vsock. Run outside a VM with
// -agent-socket/-stream-socket to serve on Unix sockets instead.
package main

import (
	"context"
	"flag"
	"net"
	"os"
	"os/signal"
	"time"

	"github.com/cube-runtime/cube/guest-agent/agent"
	"github.com/cube-runtime/cube/guest-agent/container"
	"github.com/cube-runtime/cube/guest-agent/initsys"
	"github.com/cube-runtime/cube/guest-agent/protocol"
	"github.com/mdlayher/vsock"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

func main() {
	// Must come first: this binary is also the container helper.
	container.MaybeRunInit()

	agentSock := flag.String("agent-socket", "", "serve the agent on this Unix socket instead of vsock")
	streamSock := flag.String("stream-socket", "", "serve stdio streams on this Unix socket instead of vsock")
	debug := flag.Bool("debug", false, "debug logging")
	flag.Parse()

	log := logrus.New()
	// No colours: the console is a serial line that ends up in log files.
	log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: time.StampMicro, DisableColors: true})
	if *debug {
		log.SetLevel(logrus.DebugLevel)
	}
	isInit := os.Getpid() == 1
	if isInit {
		// PID 1 gets no default signal actions: keep handlers installed (not
		// SIG_IGN, which children would inherit) and drop the signals.
		sigs := make(chan os.Signal, 8)
		signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGPIPE)
		go func() {
			for range sigs {
			}
		}()
		loaded, err := initsys.Boot()
		log.SetOutput(os.Stderr) // now the console
		if err != nil {
			log.WithError(err).Error("boot incomplete")
		}
		log.WithFields(logrus.Fields{"modules": loaded, "tmpfs_root": initsys.OnTmpfsRoot()}).Info("guest booted")
		// Unlike the rest of boot, a loopback that cannot come up stops the
		// agent: every kernel with networking (vsock included) has lo in each
		// namespace, so this is a broken guest, and serving on would hand out
		// sandboxes where 127.0.0.1 silently does not answer.
		if err := initsys.LoopbackUp(log); err != nil {
			fatal(log, isInit, err)
		}
	}
	// Ordering: after Boot mounted /proc, where every thread's slack is
	// set (before that only this thread's could be).
	if err := initsys.SetProcessTimerSlack(initsys.AgentTimerSlack); err != nil {
		log.WithError(err).Warn("timer slack not set: the agent's timers fire on their own")
	}

	reaper, err := initsys.NewReaper(log)
	if err != nil {
		fatal(log, isInit, err)
	}
	ctx := context.Background()
	go reaper.Run(ctx)

	cfg := agent.Config{Reaper: reaper, Log: log}
	if isInit {
		cfg.PowerOff = initsys.PowerOff
	}
	svc, err := agent.New(cfg)
	if err != nil {
		fatal(log, isInit, err)
	}
	listen := func(sock string, port uint32) agent.Listen {
		if sock != "" {
			return func() (net.Listener, error) {
				os.Remove(sock)
				return net.Listen("unix", sock)
			}
		}
		return func() (net.Listener, error) { return vsock.Listen(port, nil) }
	}
	log.WithFields(logrus.Fields{"agent_port": protocol.AgentPort, "stream_port": protocol.StreamPort, "version": agent.Version}).Info("agent serving")
	err = svc.Serve(ctx, listen(*agentSock, protocol.AgentPort), listen(*streamSock, protocol.StreamPort))
	fatal(log, isInit, err)
}

// fatal ends the agent; as init that means powering off (exiting would
// panic the kernel and hide the message).
func fatal(log *logrus.Logger, isInit bool, err error) {
	log.WithError(err).Error("agent stopped")
	if isInit {
		initsys.PowerOff()
		select {}
	}
	os.Exit(1)
}
