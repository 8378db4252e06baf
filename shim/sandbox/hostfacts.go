package sandbox

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// HostFacts is the CPU a snapshot was taken on (HostFactsName): a VM's
// vCPUs carry the CPUID features the guest saw, and a guest that uses a
// feature this CPU lacks faults after the restore, so a restore refuses it.
type HostFacts struct {
	CPUVendor string   `json:"cpu_vendor"`
	CPUModel  string   `json:"cpu_model"`
	CPUFlags  []string `json:"cpu_flags"`
}

// maxHostFacts bounds the file (a few KiB): it is read from a checkpoint.
const maxHostFacts = 64 << 10

// parseCPUInfo reads the first processor of /proc/cpuinfo.
func parseCPUInfo(r io.Reader) (HostFacts, error) {
	var h HostFacts
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			if h.CPUVendor != "" || len(h.CPUFlags) > 0 {
				break // the first processor's block ended
			}
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "vendor_id":
			h.CPUVendor = strings.TrimSpace(v)
		case "model name":
			h.CPUModel = strings.TrimSpace(v)
		case "flags":
			h.CPUFlags = strings.Fields(v)
		}
	}
	if err := sc.Err(); err != nil {
		return h, err
	}
	if h.CPUVendor == "" || len(h.CPUFlags) == 0 {
		return h, errors.New("no vendor_id or flags in /proc/cpuinfo")
	}
	sort.Strings(h.CPUFlags)
	return h, nil
}

func CurrentHostFacts() (*HostFacts, error) {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h, err := parseCPUInfo(f)
	if err != nil {
		return nil, err
	}
	return &h, nil
}

// HostFactsName is the file that records, in a VM snapshot directory (or
// beside a checkpoint's vm/), the CPU it was taken on: a restore elsewhere
// checks it.
const HostFactsName = "cube-host.json"

// WriteHostFacts records this host's CPU in dir.
func WriteHostFacts(dir string) error {
	h, err := CurrentHostFacts()
	if err != nil {
		return err
	}
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, HostFactsName), b, 0o600)
}

// ReadHostFacts reads a checkpoint's host facts (nil when it has none:
// a snapshot from the store, or a checkpoint of an older shim).
func ReadHostFacts(p string) (*HostFacts, error) {
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxHostFacts+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxHostFacts {
		return nil, fmt.Errorf("%s: larger than %d bytes", p, maxHostFacts)
	}
	var h HostFacts
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("%s: %v", p, err)
	}
	return &h, nil
}

// CompatibleWith says why a VM checkpointed on h cannot run on here (nil
// when it can): another CPU vendor, or CPU features here lacks.
func (h HostFacts) CompatibleWith(here HostFacts) error {
	if h.CPUVendor != here.CPUVendor {
		return fmt.Errorf("it was taken on a %s CPU (%s), this host's is %s (%s): restore it on a host with the same CPU", h.CPUVendor, h.CPUModel, here.CPUVendor, here.CPUModel)
	}
	have := map[string]bool{}
	for _, f := range here.CPUFlags {
		have[f] = true
	}
	var missing []string
	for _, f := range h.CPUFlags {
		if !have[f] {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("it was taken on a CPU (%s) with features this host's (%s) lacks: %s; restore it on a host with at least those", h.CPUModel, here.CPUModel, strings.Join(missing, " "))
	}
	return nil
}
