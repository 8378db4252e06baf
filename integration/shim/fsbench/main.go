// Command fsbench measures a file system from inside a container (BenchmarkVirtioFS runs it in a Cube
// sandbox on a virtio-fs share and on the rootfs, ext4 on virtio-blk): sequential write (fsync'd) and read
// throughput of one file, and create/stat/unlink rates of small files. It prints one JSON object per
// directory it is given.
//
//	fsbench [-mib N] [-files N] DIR...
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// Result is one directory's figures (MiB/s and operations per second).
type Result struct {
	Dir        string  `json:"dir"`
	WriteMiBs  float64 `json:"write_mib_s"`
	ReadMiBs   float64 `json:"read_mib_s"`
	CreatePerS float64 `json:"create_per_s"`
	StatPerS   float64 `json:"stat_per_s"`
	UnlinkPerS float64 `json:"unlink_per_s"`
}

func main() {
	mib := flag.Int("mib", 64, "size of the sequential file in MiB")
	files := flag.Int("files", 500, "small files created, stat'ed and unlinked")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: fsbench [-mib N] [-files N] DIR...")
		os.Exit(2)
	}
	for _, dir := range flag.Args() {
		r, err := bench(dir, *mib, *files)
		if err != nil {
			fmt.Fprintf(os.Stderr, "fsbench %s: %v\n", dir, err)
			os.Exit(1)
		}
		json.NewEncoder(os.Stdout).Encode(r)
	}
}

func bench(dir string, mib, files int) (Result, error) {
	r := Result{Dir: dir}
	work := filepath.Join(dir, "fsbench.work")
	if err := os.MkdirAll(work, 0o755); err != nil {
		return r, err
	}
	defer os.RemoveAll(work)
	var err error
	if r.WriteMiBs, r.ReadMiBs, err = sequential(filepath.Join(work, "seq"), mib); err != nil {
		return r, err
	}
	r.CreatePerS, r.StatPerS, r.UnlinkPerS, err = metadata(work, files)
	return r, err
}

// sequential writes mib MiB in 1 MiB writes and fsyncs, drops the file's cached pages, reads it back.
func sequential(path string, mib int) (float64, float64, error) {
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o644)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	start := time.Now()
	for range mib {
		if _, err := f.Write(buf); err != nil {
			return 0, 0, err
		}
	}
	if err := f.Sync(); err != nil {
		return 0, 0, err
	}
	w := float64(mib) / time.Since(start).Seconds()
	// Read what the device serves, not the page cache.
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	if _, err := f.Seek(0, 0); err != nil {
		return 0, 0, err
	}
	start = time.Now()
	n := 0
	for {
		k, err := f.Read(buf)
		n += k
		if err != nil || k == 0 {
			break
		}
	}
	if n != mib<<20 {
		return 0, 0, fmt.Errorf("read back %d bytes of %d", n, mib<<20)
	}
	return w, float64(mib) / time.Since(start).Seconds(), nil
}

// metadata creates n empty files, stats each, unlinks each; the rate of each phase.
func metadata(dir string, n int) (float64, float64, float64, error) {
	name := func(i int) string { return filepath.Join(dir, fmt.Sprintf("f%05d", i)) }
	rate := func(start time.Time) float64 { return float64(n) / time.Since(start).Seconds() }
	start := time.Now()
	for i := range n {
		f, err := os.OpenFile(name(i), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return 0, 0, 0, err
		}
		f.Close()
	}
	c := rate(start)
	start = time.Now()
	for i := range n {
		if _, err := os.Stat(name(i)); err != nil {
			return 0, 0, 0, err
		}
	}
	s := rate(start)
	start = time.Now()
	for i := range n {
		if err := os.Remove(name(i)); err != nil {
			return 0, 0, 0, err
		}
	}
	return c, s, rate(start), nil
}
