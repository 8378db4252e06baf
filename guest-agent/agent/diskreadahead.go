package agent

import (
	"os"
	"path/filepath"
	"strconv"
)

// mountReadaheadKiB is the readahead of a disk MountDisk mounts (a
// container's rootfs). With Linux's default, 128 KiB, the first exec of a
// 1 MiB binary was a dozen virtio-blk requests, each a round trip through
// the VMM. In the test host (BenchmarkCtrRunTrue, medians of 10–20 runs of
// busybox `true` from a template), the shim's Start plus the wait for the
// exit took 500–570 ms before and 369 ms after; single runs with 1, 2 and
// 4 MiB measured alike (a larger window also fills more fresh guest pages,
// which a restored VM pays for in nested page faults). The bytes come from
// the image file in the host's page cache; readahead follows sequential
// reads and the pages around a page fault, not random reads.
const mountReadaheadKiB = 2048

// setReadahead sets the readahead of block device dev (a node in DevDir);
// a failure is logged and costs only speed.
func (s *Service) setReadahead(dev string) {
	p := filepath.Join(s.cfg.SysBlock, filepath.Base(dev), "queue", "read_ahead_kb")
	if err := os.WriteFile(p, []byte(strconv.Itoa(mountReadaheadKiB)), 0o644); err != nil {
		s.log.WithError(err).WithField("device", dev).Debug("readahead not set")
	}
}
