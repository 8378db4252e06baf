package api

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/errdefs"
	"github.com/pelletier/go-toml/v2"

	"github.com/cube-runtime/cube/checkpoint/shimclient"
	"github.com/cube-runtime/cube/checkpoint/store"
)

// DefaultConfigPath is read when no config file is named.
const DefaultConfigPath = "/etc/cube/api.toml"

// Defaults (docs/api.md lists them).
const (
	DefaultListen          = "127.0.0.1:3000"
	DefaultNamespace       = "cube"
	DefaultRuntime         = shimclient.RuntimeName
	DefaultSnapshotter     = "cube"
	DefaultMaxBodyBytes    = 1 << 20
	DefaultMaxFileBytes    = 64 << 20
	DefaultRequestTimeout  = "5m"
	DefaultShutdownTimeout = "30s"
	DefaultReapInterval    = "1s"
	DefaultSandboxTimeout  = 300   // seconds, E2B's default
	DefaultMaxTimeout      = 86400 // seconds
)

// Config is cube-api's TOML configuration. Every key is optional.
type Config struct {
	// Listen is the TCP address to serve on. Beyond loopback API keys are
	// required (the daemon refuses to start without one).
	Listen string `toml:"listen"`
	// APIKeys are accepted in `Authorization: Bearer KEY` or `X-API-Key: KEY`.
	// When any is set every route but /health needs one.
	APIKeys []string `toml:"api_keys"`
	// APIKeysFile names a file with one key per line (added to APIKeys).
	APIKeysFile string `toml:"api_keys_file"`
	// ContainerdAddress is containerd's socket.
	ContainerdAddress string `toml:"containerd_address"`
	// ContainerdState is containerd's state directory (where shims' addresses are).
	ContainerdState string `toml:"containerd_state"`
	// Namespace is the containerd namespace cube-api keeps its sandboxes in.
	Namespace string `toml:"namespace"`
	// Runtime and Snapshotter are what sandboxes run with.
	Runtime     string `toml:"runtime"`
	Snapshotter string `toml:"snapshotter"`
	// StoreRoot is the snapshot store.
	StoreRoot string `toml:"store_root"`
	// DefaultTemplate is used when a create names no templateID.
	DefaultTemplate string `toml:"default_template"`
	// SandboxCommand replaces the image's entrypoint+cmd as a sandbox's main
	// process when set (it must keep running: the sandbox lives with it).
	SandboxCommand []string `toml:"sandbox_command"`
	// DefaultSandboxTimeout and MaxSandboxTimeout are in seconds.
	DefaultSandboxTimeout int `toml:"default_sandbox_timeout"`
	MaxSandboxTimeout     int `toml:"max_sandbox_timeout"`
	// MaxBodyBytes bounds a request body (413 beyond).
	MaxBodyBytes int64 `toml:"max_body_bytes"`
	// MaxFileBytes bounds a file written or read whole through the files
	// routes (413 beyond for a write; larger files are read in parts).
	MaxFileBytes int64 `toml:"max_file_bytes"`
	// RequestTimeout bounds a request other than a command's output stream.
	RequestTimeout string `toml:"request_timeout"`
	// ShutdownTimeout bounds a graceful shutdown.
	ShutdownTimeout string `toml:"shutdown_timeout"`
	// ReapInterval is how often expired sandboxes are looked for.
	ReapInterval string `toml:"reap_interval"`
	// LogLevel is logrus's level.
	LogLevel string `toml:"log_level"`
	// Network is the sandboxes' network ([network] table).
	Network NetworkConfig `toml:"network"`
}

// DefaultConfig is the configuration without a file.
func DefaultConfig() Config {
	return Config{
		Listen: DefaultListen, ContainerdAddress: defaults.DefaultAddress, ContainerdState: shimclient.DefaultState,
		Namespace: DefaultNamespace, Runtime: DefaultRuntime, Snapshotter: DefaultSnapshotter, StoreRoot: store.DefaultRoot,
		DefaultSandboxTimeout: DefaultSandboxTimeout, MaxSandboxTimeout: DefaultMaxTimeout, MaxBodyBytes: DefaultMaxBodyBytes,
		MaxFileBytes: DefaultMaxFileBytes, RequestTimeout: DefaultRequestTimeout, ShutdownTimeout: DefaultShutdownTimeout, ReapInterval: DefaultReapInterval,
		LogLevel: "info", Network: DefaultNetworkConfig(),
	}
}

// ParseConfig decodes TOML over the defaults; unknown keys are errors.
func ParseConfig(data []byte) (Config, error) {
	c := DefaultConfig()
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		var sm *toml.StrictMissingError
		if errors.As(err, &sm) {
			return Config{}, fmt.Errorf("cube-api config: %s: %w", sm.String(), errdefs.ErrInvalidArgument)
		}
		return Config{}, fmt.Errorf("cube-api config: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return c, c.Validate()
}

// LoadConfig reads path ("" = DefaultConfigPath, which may be missing).
func LoadConfig(path string) (Config, error) {
	explicit := path != ""
	if !explicit {
		path = DefaultConfigPath
	}
	data, err := os.ReadFile(path)
	if err != nil {
		if !explicit && errors.Is(err, os.ErrNotExist) {
			c := DefaultConfig()
			return c, c.Validate()
		}
		return Config{}, fmt.Errorf("read cube-api config: %w", err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Durations are the parsed duration keys.
type Durations struct {
	Request, Shutdown, Reap time.Duration
}

// Durations parses the duration keys.
func (c Config) Durations() (Durations, error) {
	var d Durations
	for _, f := range []struct {
		key, val string
		dst      *time.Duration
	}{{"request_timeout", c.RequestTimeout, &d.Request}, {"shutdown_timeout", c.ShutdownTimeout, &d.Shutdown},
		{"reap_interval", c.ReapInterval, &d.Reap}} {
		v, err := time.ParseDuration(f.val)
		if err != nil || v <= 0 {
			return Durations{}, fmt.Errorf("cube-api config: %s %q: want a positive duration such as \"30s\": %w", f.key, f.val, errdefs.ErrInvalidArgument)
		}
		*f.dst = v
	}
	return d, nil
}

// Validate checks the values.
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("cube-api config: "+format+": %w", append(a, errdefs.ErrInvalidArgument)...)
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return bad("listen %q: want HOST:PORT (%v)", c.Listen, err)
	}
	for _, kv := range [][2]string{{"namespace", c.Namespace}, {"runtime", c.Runtime}, {"snapshotter", c.Snapshotter},
		{"containerd_address", c.ContainerdAddress}, {"store_root", c.StoreRoot}} {
		if kv[1] == "" {
			return bad("%s is empty", kv[0])
		}
	}
	if c.DefaultSandboxTimeout <= 0 || c.MaxSandboxTimeout < c.DefaultSandboxTimeout {
		return bad("want 0 < default_sandbox_timeout (%d) <= max_sandbox_timeout (%d)", c.DefaultSandboxTimeout, c.MaxSandboxTimeout)
	}
	if c.MaxBodyBytes <= 0 {
		return bad("max_body_bytes %d is not positive", c.MaxBodyBytes)
	}
	if c.MaxFileBytes <= 0 || c.MaxFileBytes > 1<<40 {
		return bad("max_file_bytes %d is out of range 1..2^40", c.MaxFileBytes)
	}
	for _, k := range c.APIKeys {
		if len(k) < 16 || strings.TrimSpace(k) != k {
			return bad("an api_keys entry is shorter than 16 characters or has spaces around it")
		}
	}
	if err := c.Network.validate(); err != nil {
		return bad("%v", err)
	}
	_, err := c.Durations()
	return err
}

// Keys returns the API keys of the config and its keys file.
func (c Config) Keys() ([]string, error) {
	keys := append([]string(nil), c.APIKeys...)
	if c.APIKeysFile == "" {
		return keys, nil
	}
	b, err := os.ReadFile(c.APIKeysFile)
	if err != nil {
		return nil, fmt.Errorf("cube-api config: api_keys_file: %w", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			if len(l) < 16 {
				return nil, fmt.Errorf("cube-api config: api_keys_file %s: a key shorter than 16 characters: %w", c.APIKeysFile, errdefs.ErrInvalidArgument)
			}
			keys = append(keys, l)
		}
	}
	return keys, nil
}

// CheckAuth refuses to listen beyond loopback without an API key.
func CheckAuth(listen string, keys []string) error {
	if len(keys) > 0 {
		return nil
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("listen %q: %v: %w", listen, err, errdefs.ErrInvalidArgument)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("cube-api listens on %s, beyond loopback, and has no API key: set api_keys or api_keys_file in the config (or listen on 127.0.0.1): %w",
		listen, errdefs.ErrFailedPrecondition)
}
