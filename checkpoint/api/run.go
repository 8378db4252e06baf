package api

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/checkpoint/clone"
	"github.com/cube-runtime/cube/checkpoint/shimclient"
	"github.com/cube-runtime/cube/checkpoint/store"
)

// Run is the daemon: it connects to containerd, opens the store, serves cfg.Listen
// until ctx is done, then shuts down gracefully (command streams end, their
// processes run on; requests in flight get shutdown_timeout). ready, when not
// nil, receives the address it listens on.
func Run(ctx context.Context, cfg Config, log *logrus.Logger, ready chan<- string) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	keys, err := cfg.Keys()
	if err != nil {
		return err
	}
	if err := CheckAuth(cfg.Listen, keys); err != nil {
		return err
	}
	conn, err := shimclient.Connect(ctx, cfg.ContainerdAddress, cfg.Namespace)
	if err != nil {
		return fmt.Errorf("%w (for cube-api: containerd_address in its config)", err)
	}
	defer conn.Close()
	st, err := store.Open(ctx, cfg.StoreRoot, store.Options{})
	if err != nil {
		return fmt.Errorf("open the snapshot store at %s: %w (store_root in the config names another)", cfg.StoreRoot, err)
	}
	sn, err := PrepareNetwork(cfg.Network)
	if err != nil {
		return fmt.Errorf("the sandboxes' network: %w", err)
	}
	be := &Containerd{Conn: conn, Store: st, Namespace: cfg.Namespace, Runtime: cfg.Runtime,
		Snapshotter: cfg.Snapshotter, State: cfg.ContainerdState, Net: sn, Log: log}
	// Clones a fork left when cube-api (or `cube fork`) died mid-way go first.
	got, err := clone.CollectAbandoned(ctx, &clone.Containerd{Client: conn.Client, Namespace: cfg.Namespace})
	if err != nil {
		log.WithError(err).Warn("collect the clones of forks that did not finish")
	}
	for _, id := range got.Removed {
		log.WithField("sandbox", id).Info("removed a clone left by a fork that did not finish")
	}
	for id, err := range got.Failed {
		log.WithError(err).WithField("sandbox", id).Warn("a clone left by a fork that did not finish could not be removed")
	}
	s, err := New(cfg, keys, be, st, Options{Log: log})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	return s.Serve(ctx, ln, ready)
}

// Serve serves on ln until ctx is done, with the reaper, then shuts down.
func (s *Server) Serve(ctx context.Context, ln net.Listener, ready chan<- string) error {
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 64 << 10}
	srv.RegisterOnShutdown(s.Stop)
	rctx, stopReaper := context.WithCancel(ctx)
	defer stopReaper()
	go s.RunReaper(rctx)
	errC := make(chan error, 1)
	go func() { errC <- srv.Serve(ln) }()
	s.log.WithFields(logrus.Fields{"listen": ln.Addr().String(), "namespace": s.cfg.Namespace, "auth": len(s.keys) > 0}).Info("cube-api serving")
	if ready != nil {
		ready <- ln.Addr().String()
	}
	select {
	case err := <-errC:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	s.log.Info("cube-api shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), s.dur.Shutdown)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errC; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}
