package imagefile

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseSize parses a byte size as written in config files and labels:
// a plain decimal number of bytes ("1073741824") or a number with a binary
// unit suffix K, M, G, T (optionally followed by "iB" or "B"; all mean powers
// of 1024): "512M", "10GiB", "1.5G". The result must lie in [MinSize, MaxSize].
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("size %q: empty", s)
	}
	up := strings.ToUpper(t)
	up = strings.TrimSuffix(up, "IB")
	up = strings.TrimSuffix(up, "B")
	mult := 1.0
	if n := len(up); n > 0 {
		switch up[n-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult != 1 {
			up = strings.TrimSpace(up[:n-1])
		}
	}
	if up == "" || strings.ContainsAny(up, "+-eEnNxXpP_") {
		return 0, fmt.Errorf("size %q: not a number with an optional K/M/G/T suffix", s)
	}
	v, err := strconv.ParseFloat(up, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: %w", s, err)
	}
	b := v * mult
	if b < float64(MinSize) || b > float64(MaxSize) {
		return 0, fmt.Errorf("size %q: must be between %d and %d bytes", s, MinSize, MaxSize)
	}
	// Round up to the 4 KiB block size so mkfs uses the whole file.
	n := int64(b)
	n = (n + 4095) &^ 4095
	return n, nil
}
