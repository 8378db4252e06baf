package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/contrib/snapshotservice"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"

	"github.com/cube-runtime/cube/snapshotter"
)

// StatusFile is written under the root at start; `cube-snapshotter status` prints it.
const StatusFile = "status.json"

// Status describes a running snapshotter.
type Status struct {
	PID         int       `json:"pid"`
	Address     string    `json:"address"`
	Root        string    `json:"root"`
	Mode        string    `json:"mode"`
	DefaultSize int64     `json:"default_size"`
	Started     time.Time `json:"started"`
}

// State is the service lifecycle: Starting → Serving → Stopped.
type State int

const (
	StateStarting State = iota
	StateServing
	StateStopped
)

// Service is one running proxy snapshotter.
type Service struct {
	cfg    Config
	sn     *snapshotter.Snapshotter
	lis    net.Listener
	srv    *grpc.Server
	log    *logrus.Entry
	state  State
	status Status
}

// Start opens the snapshotter and listens on the configured socket. Serve
// must be called to handle requests.
func Start(ctx context.Context, cfg Config, log *logrus.Entry) (*Service, error) {
	opts, err := cfg.SnapshotterOptions()
	if err != nil {
		return nil, fmt.Errorf("start: config: %w", err)
	}
	opts.Log = log
	sn, err := snapshotter.New(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	lis, err := listen(cfg.Address)
	if err != nil {
		sn.Close()
		return nil, fmt.Errorf("start: %w", err)
	}
	srv := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(srv, snapshotservice.FromSnapshotter(sn))
	s := &Service{cfg: cfg, sn: sn, lis: lis, srv: srv, log: log, state: StateStarting}
	s.status = Status{
		PID: os.Getpid(), Address: cfg.Address, Root: sn.Root(), Mode: string(sn.Mode()),
		DefaultSize: opts.DefaultSize, Started: time.Now().UTC(),
	}
	if err := writeStatus(filepath.Join(sn.Root(), StatusFile), s.status); err != nil {
		s.close()
		return nil, fmt.Errorf("start: %w", err)
	}
	log.WithFields(logrus.Fields{"address": cfg.Address, "mode": sn.Mode()}).Info("cube-snapshotter listening")
	return s, nil
}

// Status returns what the status file says.
func (s *Service) Status() Status { return s.status }

// Snapshotter is the served snapshotter.
func (s *Service) Snapshotter() *snapshotter.Snapshotter { return s.sn }

// Serve handles requests until ctx is cancelled, then stops gracefully
// (in-flight calls finish) and closes the snapshotter.
func (s *Service) Serve(ctx context.Context) error {
	if s.state != StateStarting {
		return fmt.Errorf("serve: service is not in starting state")
	}
	s.state = StateServing
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.lis) }()
	var err error
	select {
	case <-ctx.Done():
		s.log.Info("shutting down")
		done := make(chan struct{})
		go func() { s.srv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			s.log.Warn("graceful stop timed out; stopping")
			s.srv.Stop()
		}
		<-errc
	case err = <-errc:
		if errors.Is(err, grpc.ErrServerStopped) {
			err = nil
		}
	}
	if cerr := s.close(); err == nil {
		err = cerr
	}
	return err
}

func (s *Service) close() error {
	s.state = StateStopped
	_ = os.Remove(filepath.Join(s.sn.Root(), StatusFile))
	_ = os.Remove(s.cfg.Address)
	return s.sn.Close()
}

// ReadStatus reads the status file of the snapshotter rooted at root.
func ReadStatus(root string) (Status, error) {
	var st Status
	b, err := os.ReadFile(filepath.Join(root, StatusFile))
	if err != nil {
		return st, fmt.Errorf("status: %w (is cube-snapshotter running with root %s?)", err, root)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("status: %s: %w", filepath.Join(root, StatusFile), err)
	}
	return st, nil
}

func writeStatus(path string, st Status) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write status: %w", err)
	}
	return os.Rename(tmp, path)
}

// listen removes a stale socket (left by a killed process) and listens anew.
func listen(address string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(address), 0o711); err != nil {
		return nil, fmt.Errorf("socket dir: %w", err)
	}
	if c, err := net.DialTimeout("unix", address, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("socket %s is in use by another process", address)
	}
	if err := os.Remove(address); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket %s: %w", address, err)
	}
	lis, err := net.Listen("unix", address)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", address, err)
	}
	if err := os.Chmod(address, 0o660); err != nil {
		lis.Close()
		return nil, fmt.Errorf("chmod %s: %w", address, err)
	}
	return lis, nil
}
