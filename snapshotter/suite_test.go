package snapshotter

import (
	"context"
	"os"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/testsuite"

	"github.com/cube-runtime/cube/snapshotter/imagefile"
	"github.com/cube-runtime/cube/snapshotter/internal/xfspool"
)

// setTempDir points TMPDIR at dir for the duration of a test: containerd's
// suite creates each snapshotter root with os.MkdirTemp("", …), and the roots
// must be on the reflink pool. (t.Setenv is not allowed with parallel subtests.)
func setTempDir(t *testing.T, dir string) {
	old, had := os.LookupEnv("TMPDIR")
	os.Setenv("TMPDIR", dir)
	t.Cleanup(func() {
		if had {
			os.Setenv("TMPDIR", old)
		} else {
			os.Unsetenv("TMPDIR")
		}
	})
}

func suiteFactory(policy ReflinkPolicy, want imagefile.Mode) testsuite.SnapshotterFunc {
	return func(ctx context.Context, root string) (snapshots.Snapshotter, func() error, error) {
		s, err := New(ctx, Options{Root: root, DefaultSize: 64 << 20, Reflink: policy})
		if err != nil {
			return nil, nil, err
		}
		if s.Mode() != want {
			s.Close()
			return nil, nil, &modeError{got: s.Mode(), want: want}
		}
		return s, s.Close, nil
	}
}

type modeError struct{ got, want imagefile.Mode }

func (e *modeError) Error() string {
	return "snapshotter mode " + string(e.got) + ", want " + string(e.want)
}

// TestContainerdSuite runs containerd's own snapshotter test suite (as root:
// it loop-mounts every image) on an XFS reflink pool, in reflink mode.
func TestContainerdSuite(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: containerd's suite mounts hundreds of loop devices")
	}
	pool := xfspool.New(t, 4<<30)
	setTempDir(t, pool)
	testsuite.SnapshotterSuite(t, "cube", suiteFactory(ReflinkRequired, imagefile.ModeReflink))
}

// TestContainerdSuiteCopyMode runs the suite with reflink disabled, to cover
// the copy fallback that machines without XFS/btrfs use.
func TestContainerdSuiteCopyMode(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: containerd's suite mounts hundreds of loop devices")
	}
	pool := xfspool.New(t, 4<<30)
	setTempDir(t, pool)
	testsuite.SnapshotterSuite(t, "cube", suiteFactory(ReflinkNever, imagefile.ModeCopy))
}
