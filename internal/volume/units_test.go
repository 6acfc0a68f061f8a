package volume

import (
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	ok := []struct {
		in   string
		want int64
	}{
		{"4096", 4096},
		{"512B", 512},
		{"1K", 1024},
		{"1k", 1024},
		{"512M", 512 << 20},
		{"20G", 20 << 30},
		{"20g", 20 << 30},
		{"1T", 1 << 40},
		{"1GiB", 1 << 30},
		{"1gib", 1 << 30},
		{"2MiB", 2 << 20},
		{"1GB", 1000000000},
		{"1MB", 1000000},
		{"1TB", 1000000000000},
		{"1.5G", 3 << 29},
		{" 10G ", 10 << 30},
		{"10 G", 10 << 30},
		{"7E", 7 << 60},
		// Forms `vmsan bench` took from fio/bonnie++ habits.
		{"4k", 4096},
		{"8KiB", 8192},
		{"1M", 1 << 20},
		{"1.5k", 1536},
		{"2T", 2 << 40},
		{"4Ki", 4096},
		{"2Mi", 2 << 20},
		{"1kiB", 1024},
	}
	for _, c := range ok {
		got, err := ParseSize(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	bad := []string{"", "G", "-1G", "10X", "1.2.3G", "0.1B", "16E", "99999999999999999999", "1e3", "10 GBs", "abc", "x", "-1", "10Q", "1e30G"}
	for _, in := range bad {
		if got, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want error", in, got)
		}
	}
}

func TestFormatSizeRoundTrip(t *testing.T) {
	for _, n := range []int64{1, 512, 4096, 4097, 10 << 30, 1536 << 20, 1 << 40, 3 << 60} {
		s := FormatSize(n)
		back, err := ParseSize(s)
		if err != nil || back != n {
			t.Errorf("FormatSize(%d) = %q -> %d, %v", n, s, back, err)
		}
	}
	if s := FormatSize(10 << 30); s != "10G" {
		t.Errorf("FormatSize(10GiB) = %q", s)
	}
	if s := HumanSize(10 << 30); s != "10.0 GiB" {
		t.Errorf("HumanSize(10GiB) = %q", s)
	}
}

func TestParseResize(t *testing.T) {
	const g = 1 << 30
	for _, c := range []struct {
		spec string
		cur  int64
		want int64
		err  string
	}{
		{"40G", 10 * g, 40 * g, ""},
		{"+10G", 10 * g, 20 * g, ""},
		{" +512M", g, g + 512<<20, ""},
		{"-1G", 10 * g, 9 * g, ""},
		{"-10G", 10 * g, 0, "cannot shrink to nothing"},
		{"+", g, 0, "empty"},
		{"+x", g, 0, "must start with a number"},
		{"+8E", 1 << 62, 0, "too large"},
	} {
		got, err := ParseResize(c.spec, c.cur)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseResize(%q, %d) = %d, %v; want error with %q", c.spec, c.cur, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ParseResize(%q, %d) = %d, %v; want %d", c.spec, c.cur, got, err, c.want)
		}
	}
}
