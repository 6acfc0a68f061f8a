package volume

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ParseSize parses a byte count with an optional unit suffix.
//
// The convention is QEMU's (qemu-img create 20G): a single-letter suffix
// K, M, G, T, P, E (case-insensitive) is binary (G = GiB = 2^30), as are the
// explicit IEC suffixes KiB, MiB, GiB, TiB, PiB, EiB (or Ki, Mi, ... as fio
// takes them). The two-letter SI
// suffixes KB, MB, GB, TB, PB, EB are decimal (GB = 10^9), because that is
// what they mean on a disk label. A trailing "B" alone, or no suffix, means
// bytes. Fractions are allowed ("1.5G") as long as the result is a whole
// number of bytes. Negative numbers, overflow and unknown suffixes are
// errors.
//
// It is the one size parser of the project: the CLI (volume sizes, bench
// block sizes), the config file and the control API all use it.
func ParseSize(s string) (int64, error) {
	orig := s
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("size: empty")
	}
	i := 0
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
		i++
	}
	num, unit := s[:i], strings.TrimSpace(s[i:])
	if num == "" {
		return 0, fmt.Errorf("size %q: must start with a number", orig)
	}
	mult, ok := unitMultiplier(unit)
	if !ok {
		return 0, fmt.Errorf("size %q: unknown unit %q (use K/M/G/T = KiB/MiB/GiB/TiB, or KB/MB/GB/TB for powers of 1000)", orig, unit)
	}
	if !strings.Contains(num, ".") {
		n, err := strconv.ParseUint(num, 10, 63)
		if err != nil {
			return 0, fmt.Errorf("size %q: %v", orig, err)
		}
		if mult != 1 && n > uint64(math.MaxInt64)/mult {
			return 0, fmt.Errorf("size %q: too large", orig)
		}
		return int64(n * mult), nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: %v", orig, err)
	}
	v := f * float64(mult)
	if v >= math.MaxInt64 {
		return 0, fmt.Errorf("size %q: too large", orig)
	}
	if v != math.Trunc(v) {
		return 0, fmt.Errorf("size %q: not a whole number of bytes", orig)
	}
	return int64(v), nil
}

func unitMultiplier(u string) (uint64, bool) {
	switch strings.ToLower(u) {
	case "", "b":
		return 1, true
	case "k", "ki", "kib":
		return 1 << 10, true
	case "m", "mi", "mib":
		return 1 << 20, true
	case "g", "gi", "gib":
		return 1 << 30, true
	case "t", "ti", "tib":
		return 1 << 40, true
	case "p", "pi", "pib":
		return 1 << 50, true
	case "e", "ei", "eib":
		return 1 << 60, true
	case "kb":
		return 1e3, true
	case "mb":
		return 1e6, true
	case "gb":
		return 1e9, true
	case "tb":
		return 1e12, true
	case "pb":
		return 1e15, true
	case "eb":
		return 1e18, true
	}
	return 0, false
}

// FormatSize renders n with the largest binary unit that divides it exactly
// (so FormatSize(ParseSize(x)) round-trips), e.g. "10G", "1536M", "4097".
func FormatSize(n int64) string {
	units := []struct {
		s string
		v int64
	}{{"E", 1 << 60}, {"P", 1 << 50}, {"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}}
	if n > 0 {
		for _, u := range units {
			if n%u.v == 0 {
				return strconv.FormatInt(n/u.v, 10) + u.s
			}
		}
	}
	return strconv.FormatInt(n, 10)
}

// HumanSize renders n approximately for people ("10.0 GiB", "512 B").
func HumanSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// ParseResize parses the size argument of a resize: an absolute size
// ("40G", as ParseSize), or one relative to cur, the volume's current size:
// "+10G" grows by 10 GiB, "-1G" shrinks by 1 GiB (shrinking still needs
// --force where the resize happens). The result must be positive.
func ParseResize(spec string, cur int64) (int64, error) {
	s := strings.TrimSpace(spec)
	if s == "" || (s[0] != '+' && s[0] != '-') {
		return ParseSize(s)
	}
	d, err := ParseSize(s[1:])
	if err != nil {
		return 0, err
	}
	if s[0] == '+' {
		if d > math.MaxInt64-cur {
			return 0, fmt.Errorf("size %q: %s plus that is too large", spec, HumanSize(cur))
		}
		return cur + d, nil
	}
	if d >= cur {
		return 0, fmt.Errorf("size %q: the volume is only %s; a volume cannot shrink to nothing", spec, HumanSize(cur))
	}
	return cur - d, nil
}
