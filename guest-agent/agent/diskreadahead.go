package agent

import (
	"os"
	"path/filepath"
	"strconv"
)

// mountReadaheadKiB is the readahead of a disk MountDisk mounts (a
// container's rootfs). With Linux's default, 128 KiB, the first exec of a
// 1 MiB binary was a dozen virtio-blk requests, each a round trip through
// the VMM: in the test host's guest, busybox `true` took 478 ms from the
// shim's Start to the exit it saw; 270–320 ms with 1, 2 or 4 MiB (two runs
// each; a larger window also fills more fresh guest pages, which a
// restored VM pays for in nested page faults). The bytes come from the
// image file in the host's page cache; readahead follows sequential reads
// and the pages around a page fault, not random reads.
const mountReadaheadKiB = 2048

// setReadahead sets the readahead of block device dev (a node in DevDir);
// a failure is logged and costs only speed.
func (s *Service) setReadahead(dev string) {
	p := filepath.Join(s.cfg.SysBlock, filepath.Base(dev), "queue", "read_ahead_kb")
	if err := os.WriteFile(p, []byte(strconv.Itoa(mountReadaheadKiB)), 0o644); err != nil {
		s.log.WithError(err).WithField("device", dev).Debug("readahead not set")
	}
}
