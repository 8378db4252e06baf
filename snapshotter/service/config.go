// Package service runs the snapshotter as containerd's proxy snapshot plugin:
// it reads the TOML configuration, serves containerd's Snapshots gRPC API on a
// Unix socket and writes a status file with the clone mode.
package service

import (
	"bytes"
	"errors"
	"fmt"
	"os"

	"github.com/pelletier/go-toml/v2"

	"github.com/cube-runtime/cube/snapshotter"
	"github.com/cube-runtime/cube/snapshotter/imagefile"
)

// Defaults, also documented in docs/snapshotter.md and DefaultTOML.
const (
	DefaultRoot    = "/var/lib/cube-snapshotter"
	DefaultAddress = "/run/cube-snapshotter/snapshotter.sock"
	DefaultSize    = "10GiB"
)

// Config is the TOML configuration file.
type Config struct {
	// Root holds metadata.db and the images; it should be on XFS (reflink=1) or btrfs.
	Root string `toml:"root"`
	// Address is the Unix socket containerd's proxy_plugins entry points at.
	Address string `toml:"address"`
	// LogLevel is a logrus level: debug, info, warn, error.
	LogLevel string `toml:"log_level"`
	// Image configures the ext4 images.
	Image ImageConfig `toml:"image"`
}

// ImageConfig configures the image files.
type ImageConfig struct {
	// DefaultSize of a new first-layer image; children inherit their parent's size
	// unless the containerd.io/snapshot/cube.size label asks for more.
	DefaultSize string `toml:"default_size"`
	// Reflink: "auto" (reflink where possible, else copy with a warning),
	// "required" (refuse to start without reflink), "never" (always copy).
	Reflink string `toml:"reflink"`
	// Ext4Features go to mkfs.ext4 -O, e.g. ["^metadata_csum_seed"]. Empty keeps
	// mke2fs.conf's ext4 defaults.
	Ext4Features []string `toml:"ext4_features"`
	// MkfsArgs are extra mkfs.ext4 arguments, e.g. ["-i", "8192"].
	MkfsArgs []string `toml:"mkfs_args"`
}

// DefaultConfig returns the configuration used when no file is given.
func DefaultConfig() Config {
	return Config{
		Root:     DefaultRoot,
		Address:  DefaultAddress,
		LogLevel: "info",
		Image: ImageConfig{
			DefaultSize: DefaultSize,
			Reflink:     string(snapshotter.ReflinkAuto),
		},
	}
}

// DefaultTOML is the default configuration as a commented TOML file.
const DefaultTOML = `# cube-snapshotter configuration (all keys optional; values shown are the defaults)

# Metadata and image files. Put this on XFS (mkfs.xfs -m reflink=1) or btrfs so
# children are reflinks; contrib/scripts/cube-xfs-pool.sh makes a loop-mounted pool.
root = "` + DefaultRoot + `"

# Unix socket for containerd's [proxy_plugins.cube] address.
address = "` + DefaultAddress + `"

# logrus level: debug, info, warn, error
log_level = "info"

[image]
# Size of a new (first-layer) image, sparse: it costs only what is written.
# Per snapshot: label containerd.io/snapshot/cube.size (grows children too).
default_size = "` + DefaultSize + `"

# "auto": reflink if the filesystem can, else full copies with a warning at start.
# "required": refuse to start without reflink. "never": always copy.
reflink = "auto"

# mkfs.ext4 -O features, e.g. ["^has_journal"]; empty = mke2fs.conf defaults.
ext4_features = []

# Extra mkfs.ext4 arguments, e.g. ["-i", "8192"] for more inodes.
mkfs_args = []
`

// LoadConfig reads a TOML file over the defaults. Unknown keys are errors, so
// a misspelt key is not silently ignored.
func LoadConfig(path string) (Config, error) {
	cfg := DefaultConfig()
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	if err := ParseConfig(b, &cfg); err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig decodes TOML into cfg (which should hold defaults) and validates it.
func ParseConfig(b []byte, cfg *Config) error {
	dec := toml.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(cfg); err != nil {
		var sme *toml.StrictMissingError
		if errors.As(err, &sme) {
			return fmt.Errorf("%s", sme.String())
		}
		return err
	}
	_, err := cfg.SnapshotterOptions()
	return err
}

// SnapshotterOptions validates the configuration and converts it.
func (c Config) SnapshotterOptions() (snapshotter.Options, error) {
	if c.Root == "" {
		return snapshotter.Options{}, fmt.Errorf("root must be set")
	}
	if c.Address == "" {
		return snapshotter.Options{}, fmt.Errorf("address must be set")
	}
	size, err := imagefile.ParseSize(c.Image.DefaultSize)
	if err != nil {
		return snapshotter.Options{}, fmt.Errorf("image.default_size: %w", err)
	}
	switch p := snapshotter.ReflinkPolicy(c.Image.Reflink); p {
	case snapshotter.ReflinkAuto, snapshotter.ReflinkRequired, snapshotter.ReflinkNever:
	default:
		return snapshotter.Options{}, fmt.Errorf("image.reflink = %q: want auto, required or never", c.Image.Reflink)
	}
	return snapshotter.Options{
		Root:        c.Root,
		DefaultSize: size,
		Reflink:     snapshotter.ReflinkPolicy(c.Image.Reflink),
		Ext4:        imagefile.Ext4Options{Features: c.Image.Ext4Features, ExtraArgs: c.Image.MkfsArgs},
	}, nil
}
