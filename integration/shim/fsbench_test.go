package shim

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cube-runtime/cube/integration/cubetest"
)

// fsbenchBin is integration/shim/fsbench in the test host (static; bind-mounted into the container).
const fsbenchBin = "/cube/bin/fsbench"

// fsbenchResult is one line of fsbench's output.
type fsbenchResult struct {
	Dir        string  `json:"dir"`
	WriteMiBs  float64 `json:"write_mib_s"`
	ReadMiBs   float64 `json:"read_mib_s"`
	CreatePerS float64 `json:"create_per_s"`
	StatPerS   float64 `json:"stat_per_s"`
	UnlinkPerS float64 `json:"unlink_per_s"`
}

// BenchmarkVirtioFS is issue 17's benchmark (`make bench-shim`; tables only): in one Cube sandbox, fsbench
// measures sequential write (fsync'd) and read (page cache dropped) throughput of a 16 MiB file and
// create/stat/unlink rates of 200 small files (sizes that fit the container's 64 MiB rootfs, the
// snapshotter's default_size, beside the image), on a host directory shared through cube-vmm's virtio-fs
// (`ctr run --mount type=bind`) and on the container's rootfs (ext4 on virtio-blk), alternating, three
// rounds; medians side by side with the virtio-fs / ext4 ratio.
func BenchmarkVirtioFS(b *testing.B) {
	d := startDaemons(b)
	const rounds = 3
	for b.Loop() {
		share := filepath.Join(b.TempDir(), "share")
		if err := os.MkdirAll(share, 0o755); err != nil {
			b.Fatal(err)
		}
		var dirs []string
		for range rounds {
			dirs = append(dirs, "/data", "/ext4")
		}
		out, rc, err := d.CtrQuiet(nil, "run", "--rm", "--runtime", "io.cube.v1", "--snapshotter", "cube",
			"--mount", "type=bind,src="+share+",dst=/data,options=rbind:rw",
			// The directory: a host file over 1 MiB is not copied into the VM, and a directory is shared.
			"--mount", "type=bind,src="+filepath.Dir(fsbenchBin)+",dst=/b,options=rbind:ro",
			cubetest.ImageRef, "fsbench1", "sh", "-c", "mkdir -p /ext4 && /b/"+filepath.Base(fsbenchBin)+" -mib 16 -files 200 "+strings.Join(dirs, " "))
		if err != nil || rc != 0 {
			b.Fatalf("ctr run fsbench: rc %d %v\n%s", rc, err, out)
		}
		got := map[string][]fsbenchResult{}
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			var r fsbenchResult
			if json.Unmarshal(sc.Bytes(), &r) == nil && r.Dir != "" {
				got[r.Dir] = append(got[r.Dir], r)
			}
		}
		if len(got["/data"]) != rounds || len(got["/ext4"]) != rounds {
			b.Fatalf("fsbench: want %d results per directory, got:\n%s", rounds, out)
		}
		if ents, _ := os.ReadDir(share); len(ents) != 0 {
			b.Errorf("fsbench left %d entries in the shared directory", len(ents))
		}
		b.Log("\n" + fsbenchTable(got["/data"], got["/ext4"]))
	}
}

// fsbenchTable prints the medians of virtio-fs and ext4-on-virtio-blk side by side.
func fsbenchTable(fs, ext4 []fsbenchResult) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "| in the guest (median of %d) | virtio-fs share | ext4 on virtio-blk | virtio-fs / ext4 |\n|---|---|---|---|\n", len(fs))
	row := func(name, unit string, get func(fsbenchResult) float64) {
		a, e := medianOf(fs, get), medianOf(ext4, get)
		ratio := 0.0
		if e > 0 {
			ratio = a / e
		}
		fmt.Fprintf(&sb, "| %s | %.1f %s | %.1f %s | %.2fx |\n", name, a, unit, e, unit, ratio)
	}
	row("sequential write 16 MiB + fsync", "MiB/s", func(r fsbenchResult) float64 { return r.WriteMiBs })
	row("sequential read 16 MiB (cache dropped)", "MiB/s", func(r fsbenchResult) float64 { return r.ReadMiBs })
	row("create", "/s", func(r fsbenchResult) float64 { return r.CreatePerS })
	row("stat", "/s", func(r fsbenchResult) float64 { return r.StatPerS })
	row("unlink", "/s", func(r fsbenchResult) float64 { return r.UnlinkPerS })
	return sb.String()
}

func medianOf(rs []fsbenchResult, get func(fsbenchResult) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = get(r)
	}
	slices.Sort(v)
	if len(v) == 0 {
		return 0
	}
	return v[len(v)/2]
}
